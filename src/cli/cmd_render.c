#include "cli/cli.h"
int cli_render(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return 1;
}
