//! Lanes (docs/deploying.md, "The two lanes"), in memory on tokio's paused clock: a job with a
//! deadline reads its body unchanged, moves to the lane the rule picks
//! where it is let go, comes back to Spot once ahead of its line, and the
//! lane keeper moves the jobs waiting behind their line, once each, a
//! keeper killed mid-move losing and doubling nothing. A job without a
//! deadline does exactly what it did before lanes existed. Under faults
//! (a hold that runs out mid-move, a half-finished move's copy of a
//! poisoned job), no job runs in two places at once or after its poison.

mod common;
mod faults;
mod finish_without_lanes;
mod keeper;
mod release;
mod reserved;
mod without_deadline;
