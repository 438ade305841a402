/* cmocka_filter.c: EDL_TEST_FILTER picks which tests of a test program run, in every program
 * (linked into each by tests/CMakeLists.txt): EDL_TEST_FILTER='*teacher*' build/tests/test_agent.
 * cmocka reads no filter from the environment itself; this sets it before main. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

__attribute__((constructor)) static void filter_from_env(void)
{
    const char *f = getenv("EDL_TEST_FILTER");
    if (f && *f)
        cmocka_set_test_filter(f);
}
