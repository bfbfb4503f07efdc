//! How many cases the operator commands' bad-input properties run
//! (`enqueue`'s lines, `poison`'s messages): at least ten thousand in CI,
//! more when `PROPTEST_CASES` asks for a long run. One home, so both
//! properties count the same way.

use proptest::test_runner::Config;

/// Cases per property in CI.
pub const CI_CASES: u32 = 10_000;

/// At least [`CI_CASES`]; `PROPTEST_CASES` raises it for a long run.
pub fn config() -> Config {
    let from_env = Config::default();
    Config {
        cases: from_env.cases.max(CI_CASES),
        failure_persistence: None,
        ..from_env
    }
}
