// The options table (util/option_rows.h): the engine's own rows, and every backend's after
// them; and Initialize's check of a whole EngineOptions against them.
#pragma once

#include <vector>

#include "util/option_rows.h"
#include "xfer/options.h"
#include "xfer/status.h"

namespace xfer {

// Every row: the engine's own, then each backend's in the registry's order.
const std::vector<options::Row>& OptionRows();
// Each row's range and check, then each backend's own checks (Backend::CheckOptions).
Status CheckOptions(const EngineOptions& options);

}  // namespace xfer
