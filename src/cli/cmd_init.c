#include "cli/cli.h"
int cli_init(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return 1;
}
