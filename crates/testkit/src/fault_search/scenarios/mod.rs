//! The scenario families a fault search runs, one per part of the library
//! and the invariants it must keep; each takes the run's [`FaultPlan`]
//! (`crate::fault_search::FaultPlan`) and drives real library code.

pub mod chunks;
