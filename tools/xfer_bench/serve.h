// The target side: one client session on a control channel, and `xfer-bench serve`.
#pragma once

#include "config.h"
#include "ctl.h"

namespace xfer::bench {

// Serves one client on `ctl`: the client's configuration, an engine on engine_host (port 0), the
// region; per size, CPU marks and (bidirectional) the same test toward the client. Returns an
// error message, empty when the session ended normally.
// side: this side's own host_id, secret_file and metrics_listen (the client's are not used).
std::string ServeSession(Ctl& ctl, const std::string& engine_host, const Config& side, bool in_process,
                         bool verbose);
// `xfer-bench serve`: clients one after the other on --listen, or one local child's session on
// --ctl-fd. The exit code.
int RunServe(const Config& c);

}  // namespace xfer::bench
