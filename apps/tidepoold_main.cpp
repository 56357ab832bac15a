// tidepoold: the Tidepool daemon. Thin main: parses flags and runs tp::daemon.
#include "api/daemon.h"

int main(int argc, char** argv) { return tp::api::daemon_main(argc, argv); }
