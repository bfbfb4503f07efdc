//! Table tests of the fleet's Spot history.

use super::*;

const H: f64 = 3600.0;

/// Spot there for `run` seconds, then away for `outage` seconds, `cycles`
/// times from `from`; it ends with Spot there again.
fn periodic(from: f64, run: f64, outage: f64, cycles: usize) -> SpotHistory {
    let mut seen = SpotHistory::default();
    let mut at = from;
    for _ in 0..cycles {
        seen.see(true, at);
        seen.see(false, at + run);
        at += run + outage;
    }
    seen.see(true, at);
    seen
}

fn plan(time_left_h: f64, budget_h: f64) -> Plan {
    Plan {
        time_left: time_left_h * H,
        work_left: (time_left_h - budget_h).max(0.0) * H,
        budget: budget_h * H,
        overhead: 0.1 * H,
        price_ratio: 3.0,
    }
}

#[test]
fn sightings_are_transitions() {
    let mut seen = SpotHistory::default();
    assert_eq!(seen.current(), None);
    assert!(!seen.is_there());
    seen.see(true, 100.0);
    seen.see(true, 200.0); // the same state: nothing changes
    seen.see(false, 50.0); // older than the state's start: ignored
    seen.see(false, f64::NAN); // not a time: ignored
    assert_eq!(
        seen.current(),
        Some(Current {
            there: true,
            since: 100.0
        })
    );
    seen.see(false, 400.0);
    seen.see(true, 1000.0);
    assert_eq!(seen.runs(1000.0), vec![300.0]);
    assert_eq!(seen.outages(1000.0), vec![600.0]);
    assert_eq!(seen.outage_age(1200.0), 0.0);
    assert_eq!(seen.run_age(1200.0), 200.0);
    seen.see(false, 1300.0);
    assert_eq!(seen.outage_age(1400.0), 100.0);
    assert_eq!(seen.run_age(1400.0), 0.0);
    assert_eq!(seen.availability(1400.0), 600.0 / 1200.0);
}

#[test]
fn the_window_forgets_what_ended_long_ago() {
    // One outage 100 h ago, one 1 h ago.
    let now = 200.0 * H;
    let mut seen = SpotHistory::default();
    for (there, at) in [(true, 90.0), (false, 100.0), (true, 101.0), (false, 199.0)] {
        seen.see(there, at * H);
    }
    seen.see(true, now - 0.5 * H);
    assert_eq!(seen.outages(now), vec![0.5 * H]);
    assert_eq!(seen.seen(now), WINDOW_HOURS * H);
    // The whole of it, a hundred hours later: nothing in the window.
    assert_eq!(seen.outages(now + 100.0 * H), Vec::<f64>::new());
    assert_eq!(seen.mean_run(now + 100.0 * H), None);
}

#[test]
fn a_cycle_needs_a_day_and_two_outages() {
    // (what was seen, now, the mean cycle)
    let rows = [
        ("nothing", SpotHistory::default(), 0.0, None),
        ("one outage", periodic(0.0, 30.0 * H, H, 1), 40.0 * H, None),
        (
            "two outages in 10 h",
            periodic(0.0, 4.0 * H, H, 2),
            10.0 * H,
            None,
        ),
        (
            "two outages, a day",
            periodic(0.0, 11.0 * H, H, 2),
            24.0 * H,
            Some(12.0 * H),
        ),
        (
            "three days, a cycle of 6 h",
            periodic(0.0, 5.0 * H, H, 12),
            72.0 * H,
            Some(6.0 * H),
        ),
        // Four days: the outages of the first day have left the window.
        (
            "four days",
            periodic(0.0, 5.0 * H, H, 16),
            96.0 * H,
            Some(72.0 * H / 13.0),
        ),
    ];
    for (case, seen, now, cycle) in rows {
        assert_eq!(seen.mean_cycle(now), cycle, "{case}");
    }
}

#[test]
fn patience_waits_out_the_outages_the_slack_affords() {
    let now = 72.0 * H;
    // Short outages only (10 min in every 4 h): with slack, wait them all
    // out; with none, bridge each at once.
    let short = periodic(0.0, 4.0 * H - 600.0, 600.0, 18);
    // Mostly 5-minute outages, and every tenth one lasts 10 h.
    let mut mixed = SpotHistory::default();
    let mut at = 0.0;
    for i in 0..10 {
        mixed.see(true, at);
        at += 2.0 * H;
        mixed.see(false, at);
        at += if i == 9 { 10.0 * H } else { 300.0 };
    }
    mixed.see(true, at);
    let now_mixed = at + H;
    // (history, now, time left and budget in hours, patience in seconds)
    let rows = [
        (
            "short outages, ample slack",
            &short,
            now,
            40.0,
            20.0,
            f64::INFINITY,
        ),
        (
            "short outages, too little slack to wait them all",
            &short,
            now,
            40.0,
            2.2,
            0.0,
        ),
        (
            "rare long outages, some slack",
            &mixed,
            now_mixed,
            40.0,
            4.0,
            300.0,
        ),
    ];
    for (case, seen, now, time_left, budget, patience) in rows {
        assert_eq!(
            seen.patience(&plan(time_left, budget), now),
            Some(patience),
            "{case}"
        );
    }
    assert_eq!(
        SpotHistory::default().patience(&plan(40.0, 20.0), now),
        None
    );
}

#[test]
fn a_tight_budget_joins_only_runs_that_have_lasted() {
    // Runs of 1, 2, …, 9 h, each followed by an outage of an hour.
    let mut seen = SpotHistory::default();
    let mut at = 0.0;
    for run in 1..=9 {
        seen.see(true, at);
        at += f64::from(run) * H;
        seen.see(false, at);
        at += H;
    }
    seen.see(true, at);
    let now = at;
    // 54 h seen, 9 outages: a cycle of 6 h. 48 h left is 8 cycles, whose
    // two switches each cost 8 × 0.2 h = 1.6 h of slack.
    assert_eq!(seen.mean_cycle(now), Some(6.0 * H));
    // (budget in hours, the age from which a run is joined, in hours)
    let rows = [(2.0, 0.0), (1.6, 0.0), (0.8, 5.0), (0.2, 8.0), (0.0, 9.0)];
    for (budget, age) in rows {
        assert_eq!(
            seen.joining_age(&plan(48.0, budget), now),
            age * H,
            "budget {budget} h"
        );
    }
}

#[test]
fn the_document_is_bounded_and_round_trips() {
    let mut seen = SpotHistory::default();
    for i in 0..(MAX_PERIODS + 100) {
        seen.see(i % 2 == 0, i as f64);
    }
    let json = serde_json::to_string(&seen).unwrap();
    let back: SpotHistory = serde_json::from_str(&json).unwrap();
    assert_eq!(back, seen);
    let now = (MAX_PERIODS + 100) as f64;
    assert_eq!(back.runs(now).len() + back.outages(now).len(), MAX_PERIODS);
}
