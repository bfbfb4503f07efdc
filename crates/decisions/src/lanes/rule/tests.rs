//! The lane rule's table tests.

use super::*;

use crate::lanes::test_time::{H, at, hours};

/// The paper's setting: 48 h of work due 70 h after the start, d of
/// 0.2 h (so 2d = 0.4 h); the line expects 48/70 h of work per hour.
fn situation(lane: Lane, phase: Phase, progress: f64, now: f64) -> Situation {
    Situation {
        deadline: Some(Deadline {
            start: at(0.0),
            due: at(70.0),
            work: hours(48.0),
        }),
        progress: hours(progress),
        lane,
        phase,
        now: at(now),
        switch_cost: hours(0.2),
        recheck: Duration::ZERO,
        spot_there: true,
    }
}

fn check(rows: &[(&str, Situation, Lane, Reason)]) {
    for (case, situation, lane, reason) in rows {
        let choice = choose_lane(situation);
        assert_eq!(
            (choice.lane, choice.reason),
            (*lane, *reason),
            "{case}: {situation:?}"
        );
    }
}

#[test]
fn uniform_progress() {
    use Lane::{Regular, Spot};
    use Phase::{Released, Running, Waiting};
    // At 35 h the line is at 24 h; 2d later (35.4 h) at 24.274 h.
    check(&[
        (
            "behind, waiting for Spot",
            situation(Spot, Waiting, 20.0, 35.0),
            Regular,
            Reason::BehindTheLine,
        ),
        (
            "behind, just evicted",
            situation(Spot, Released, 20.0, 35.0),
            Regular,
            Reason::BehindTheLine,
        ),
        (
            "behind by a second",
            situation(Spot, Waiting, 24.0 - 1.0 / H, 35.0),
            Regular,
            Reason::BehindTheLine,
        ),
        (
            "on the line",
            situation(Spot, Waiting, 24.0, 35.0),
            Spot,
            Reason::OnTheLine,
        ),
        (
            "ahead, just evicted",
            situation(Spot, Released, 30.0, 35.0),
            Spot,
            Reason::OnTheLine,
        ),
        (
            "behind, running on Spot",
            situation(Spot, Running, 20.0, 35.0),
            Spot,
            Reason::RunningOnSpot,
        ),
        (
            "regular, running, ahead by less than 2d",
            situation(Regular, Running, 24.2, 35.0),
            Regular,
            Reason::CatchingUp,
        ),
        (
            "regular, running, ahead by 2d",
            situation(Regular, Running, 24.3, 35.0),
            Spot,
            Reason::CaughtUp,
        ),
        (
            "regular, waiting, behind",
            situation(Regular, Waiting, 20.0, 35.0),
            Regular,
            Reason::CatchingUp,
        ),
        (
            "regular, released, ahead by 2d",
            situation(Regular, Released, 30.0, 35.0),
            Spot,
            Reason::CaughtUp,
        ),
        (
            "regular, running, ahead by 2d, no Spot seen",
            Situation {
                spot_there: false,
                ..situation(Regular, Running, 24.3, 35.0)
            },
            Regular,
            Reason::SpotAway,
        ),
        (
            "regular, released, ahead by 2d, no Spot seen",
            Situation {
                spot_there: false,
                ..situation(Regular, Released, 30.0, 35.0)
            },
            Regular,
            Reason::SpotAway,
        ),
        (
            "Spot, waiting, on the line, no Spot seen: it waits",
            Situation {
                spot_there: false,
                ..situation(Spot, Waiting, 30.0, 35.0)
            },
            Spot,
            Reason::OnTheLine,
        ),
    ]);
}

#[test]
fn the_safety_net() {
    use Lane::{Regular, Spot};
    use Phase::{Released, Running, Waiting};
    // At 60 h, 10 h left: 38.4 h done leaves a slack of exactly 2d.
    let at_2d = situation(Spot, Waiting, 38.4, 60.0);
    // Half an hour before the deadline, 0.1 h ahead of the line: the
    // slack (0.257 h) is less than 2d all the same.
    let ahead = 48.0 * 69.5 / 70.0 + 0.1;
    check(&[
        (
            "slack of exactly 2d: not yet (behind the line)",
            at_2d,
            Regular,
            Reason::BehindTheLine,
        ),
        (
            "slack of 2d, one recheck to come",
            Situation {
                recheck: Duration::from_secs(60),
                ..at_2d
            },
            Regular,
            Reason::SafetyNet,
        ),
        (
            "slack under 2d, waiting",
            situation(Spot, Waiting, 38.3, 60.0),
            Regular,
            Reason::SafetyNet,
        ),
        (
            "slack under 2d, just evicted",
            situation(Spot, Released, 38.3, 60.0),
            Regular,
            Reason::SafetyNet,
        ),
        (
            "slack under 2d, ahead of the line",
            situation(Spot, Waiting, ahead, 69.5),
            Regular,
            Reason::SafetyNet,
        ),
        (
            "slack under 2d, regular, ahead by 2d",
            situation(Regular, Running, ahead, 69.5),
            Regular,
            Reason::SafetyNet,
        ),
        (
            "slack under 2d, running on Spot: never moved",
            situation(Spot, Running, 38.3, 60.0),
            Spot,
            Reason::RunningOnSpot,
        ),
    ]);
}

#[test]
fn without_a_deadline_always_spot() {
    for lane in [Lane::Spot, Lane::Regular] {
        for phase in [Phase::Waiting, Phase::Released, Phase::Running] {
            let choice = choose_lane(&Situation {
                deadline: None,
                ..situation(lane, phase, 0.0, 1_000.0)
            });
            assert_eq!(
                choice,
                LaneChoice {
                    lane: Lane::Spot,
                    reason: Reason::NoDeadline,
                    standing: None
                },
                "{lane:?} {phase:?}"
            );
        }
    }
}

#[test]
fn odd_inputs_have_an_answer() {
    use Lane::{Regular, Spot};
    use Phase::{Running, Waiting};
    let base = situation(Spot, Waiting, 0.0, 35.0);
    let deadline = base.deadline.unwrap();
    let with = |due: f64, work: f64| {
        Some(Deadline {
            due: at(due),
            work: hours(work),
            ..deadline
        })
    };
    check(&[
        (
            "deadline before the start: everything due, regular",
            Situation {
                deadline: with(-5.0, 48.0),
                ..base
            },
            Regular,
            Reason::SafetyNet,
        ),
        (
            "deadline at the start, running on Spot: never moved",
            Situation {
                deadline: with(0.0, 48.0),
                phase: Running,
                ..base
            },
            Spot,
            Reason::RunningOnSpot,
        ),
        (
            "no work: on the line",
            Situation {
                deadline: with(70.0, 0.0),
                ..base
            },
            Spot,
            Reason::OnTheLine,
        ),
        (
            "no work, 0.1 h before the deadline: two switches no longer fit",
            Situation {
                deadline: with(70.0, 0.0),
                now: at(69.9),
                ..base
            },
            Regular,
            Reason::SafetyNet,
        ),
        (
            "more progress than work",
            situation(Spot, Waiting, 50.0, 35.0),
            Spot,
            Reason::OnTheLine,
        ),
        (
            "more progress than work, regular",
            situation(Regular, Running, 50.0, 35.0),
            Spot,
            Reason::CaughtUp,
        ),
        (
            "after the deadline",
            situation(Spot, Waiting, 40.0, 75.0),
            Regular,
            Reason::SafetyNet,
        ),
        (
            "after the deadline, running on Spot",
            situation(Spot, Running, 40.0, 75.0),
            Spot,
            Reason::RunningOnSpot,
        ),
        (
            "after the deadline, all done",
            situation(Regular, Running, 48.0, 75.0),
            Regular,
            Reason::SafetyNet,
        ),
        (
            "a clock before the start",
            situation(Spot, Waiting, 0.0, -1.0),
            Spot,
            Reason::OnTheLine,
        ),
        (
            "a switch that takes forever",
            Situation {
                switch_cost: Duration::MAX,
                recheck: Duration::MAX,
                ..base
            },
            Regular,
            Reason::SafetyNet,
        ),
        (
            "switches that cost nothing: on the line is ahead by 2d",
            Situation {
                switch_cost: Duration::ZERO,
                ..situation(Regular, Running, 24.0, 35.0)
            },
            Spot,
            Reason::CaughtUp,
        ),
    ]);
}
