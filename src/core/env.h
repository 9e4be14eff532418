// Switches read from the environment (for measurements and debugging).
#pragma once

namespace ferry {

// NAME is set to "0" or "off": a switch that is on by default is turned off.
bool env_off(const char* name);
// NAME is set to anything else but the empty string: a switch that is off by default is on.
bool env_on(const char* name);

}  // namespace ferry
