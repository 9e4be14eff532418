// The tests' main: registers the built-in backends (ferry::init_backends), then runs GoogleTest.
#include <gtest/gtest.h>

#include "ferry/backends.h"

int main(int argc, char** argv) {
    ferry::init_backends();
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
