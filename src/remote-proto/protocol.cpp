#include "remote-proto/protocol.h"

namespace ferry::remote {

const char* cmd_name(uint16_t cmd) {
    static const char* const kNames[] = {
        "?",
        "HELLO",
        "LIST_DEVICES",
        "DEVICE_MEMORY",
        "SUPPORTS_OP",
        "BUFFER_ALLOC",
        "BUFFER_FREE",
        "BUFFER_CLEAR",
        "TENSOR_SET",
        "TENSOR_GET",
        "TENSOR_MEMSET",
        "TENSOR_COPY",
        "GRAPH_COMPUTE",
        "SYNCHRONIZE",
        "SESSION_STATS",
        "PING",
        "EVENT_NEW",
        "EVENT_FREE",
        "EVENT_RECORD",
        "EVENT_WAIT",
        "EVENT_SYNCHRONIZE",
        "ALLOC_SIZE",
        "INIT_TENSOR",
        "PREPARE_WEIGHTS",
        "STRIPE_JOIN",
        "STRIPES",
    };
    static_assert(sizeof(kNames) / sizeof(kNames[0]) == kCmdMax + 1);
    return cmd <= kCmdMax ? kNames[cmd] : "UNKNOWN";
}

}  // namespace ferry::remote
