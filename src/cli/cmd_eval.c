#include "cli/cli.h"
int cli_eval(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return 1;
}
