//! Table tests of the patient policy.

use std::time::Duration;

use super::*;
use crate::lanes::Deadline;

const H: f64 = 3600.0;
/// Where the job starts on the Unix clock.
const T0: f64 = 1_800_000_000.0;

fn at(hours: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(T0 + hours * H)
}

/// 48 h of work due in 70 h, d = 0.1 h, asked every minute.
fn situation(lane: Lane, phase: Phase, progress_h: f64, now_h: f64, spot_there: bool) -> Situation {
    Situation {
        deadline: Some(Deadline {
            start: at(0.0),
            due: at(70.0),
            work: Duration::from_secs_f64(48.0 * H),
        }),
        progress: Duration::from_secs_f64(progress_h * H),
        lane,
        phase,
        now: at(now_h),
        switch_cost: Duration::from_secs(360),
        recheck: Duration::from_secs(60),
        spot_there,
    }
}

/// From two days before the job until `until_h` (job hours), Spot there
/// for `run_h` hours, then away for `outage_h`, over and over; then Spot
/// there, and from the job hour in `last`, what `last` says.
fn cycles(run_h: f64, outage_h: f64, until_h: f64, last: Option<(bool, f64)>) -> SpotHistory {
    let mut seen = SpotHistory::default();
    let mut t = T0 - 48.0 * H;
    while t < T0 + until_h * H {
        seen.see(true, t);
        seen.see(false, t + run_h * H);
        t += (run_h + outage_h) * H;
    }
    seen.see(true, t);
    if let Some((there, from)) = last {
        seen.see(there, T0 + from * H);
    }
    seen
}

/// [`cycles`] with outages of 10 minutes.
fn fleet(run_h: f64, last: Option<(bool, f64)>) -> SpotHistory {
    cycles(run_h, 1.0 / 6.0, 0.0, last)
}

#[test]
fn patient() {
    use Lane::{Regular, Spot};
    use Phase::{Released, Running, Waiting};
    let learned = fleet(4.0, Some((false, 15.0 - 5.0 / 60.0)));
    // Outages of 3 h in every 7; at 50 h, 6 minutes into one.
    let long_outages = cycles(4.0, 3.0, 40.0, Some((false, 49.9)));
    let short_runs = fleet(0.2, Some((true, 14.9)));
    let nothing = SpotHistory::default();
    // At 15 h the line is at 10.29 h; slack is 55 − 38 = 17 h at 10 h done.
    let rows = [
        (
            "running on Spot: never moved",
            situation(Spot, Running, 5.0, 15.0, false),
            &learned,
            Spot,
            Reason::RunningOnSpot,
        ),
        (
            "the safety net holds",
            situation(Spot, Waiting, 10.0, 59.9, false),
            &learned,
            Regular,
            Reason::SafetyNet,
        ),
        (
            "no history: Uniform Progress",
            situation(Spot, Waiting, 10.0, 15.0, false),
            &nothing,
            Regular,
            Reason::BehindTheLine,
        ),
        (
            "behind, 5 minutes into an outage: waits it out",
            situation(Spot, Waiting, 10.0, 15.0, false),
            &learned,
            Spot,
            Reason::WaitingOutOutage,
        ),
        (
            "behind, just evicted: waits",
            situation(Spot, Released, 10.0, 15.0, false),
            &learned,
            Spot,
            Reason::WaitingOutOutage,
        ),
        (
            "behind with 2 h of slack, in an outage that may last 3 h: regular",
            situation(Spot, Waiting, 30.0, 50.0, false),
            &long_outages,
            Regular,
            Reason::OutageOutlasted,
        ),
        (
            "on the line: Uniform Progress's answer",
            situation(Spot, Waiting, 35.0, 50.0, false),
            &long_outages,
            Spot,
            Reason::OnTheLine,
        ),
        (
            "regular, behind, Spot there with long runs: back to Spot",
            situation(Regular, Running, 10.0, 15.0, true),
            &fleet(4.0, None),
            Spot,
            Reason::SpotRunJoined,
        ),
        (
            "regular, ahead, Spot away: stays",
            situation(Regular, Running, 12.0, 15.0, false),
            &learned,
            Regular,
            Reason::WaitingForSpotRun,
        ),
        (
            "regular, Spot there but its runs too short for two switches",
            situation(Regular, Running, 12.0, 15.0, true),
            &short_runs,
            Regular,
            Reason::WaitingForSpotRun,
        ),
    ];
    for (case, situation, history, lane, reason) in rows {
        let choice = choose_lane_patiently(&situation, history, 3.0);
        assert_eq!((choice.lane, choice.reason), (lane, reason), "{case}");
        assert_eq!(
            LanePolicy::Patient.choose(&situation, history, 3.0),
            choice,
            "{case}"
        );
    }
}

#[test]
fn uniform_progress_ignores_the_history() {
    let waiting = situation(Lane::Spot, Phase::Waiting, 10.0, 15.0, false);
    let learned = fleet(4.0, Some((false, 14.9)));
    assert_eq!(
        LanePolicy::UniformProgress.choose(&waiting, &learned, 3.0),
        choose_lane(&waiting)
    );
}

#[test]
fn policies_are_named() {
    for policy in [LanePolicy::UniformProgress, LanePolicy::Patient] {
        assert_eq!(LanePolicy::parse(policy.as_str()), Some(policy));
    }
    assert_eq!(LanePolicy::parse("greedy"), None);
    assert_eq!(LanePolicy::default(), LanePolicy::Patient);
    assert_eq!(unix_secs(at(1.0)), T0 + H);
    assert_eq!(
        unix_secs(SystemTime::UNIX_EPOCH - Duration::from_secs(5)),
        -5.0
    );
}
