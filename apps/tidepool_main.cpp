// tidepool: the command-line client (src/cli/).
#include "cli/cli.h"

int main(int argc, char** argv) { return tp::cli::main(argc, argv); }
