//! The scale-in rules' table tests.

use super::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn idle(seconds: u64) -> Activity {
    Activity::Idle {
        idle_for: secs(seconds),
    }
}

fn busy(unsaved_seconds: u64) -> Activity {
    Activity::Busy {
        unsaved: secs(unsaved_seconds),
    }
}

use Activity::{Draining, Starting};

const GRACE: Duration = Duration::from_secs(120);

#[test]
fn a_worker_is_protected_while_it_holds_work_and_through_the_grace() {
    // (activity, grace, protected, why)
    let table = [
        (busy(0), GRACE, true, "just took a message"),
        (busy(3000), GRACE, true, "50 minutes unsaved"),
        (busy(0), Duration::ZERO, true, "busy, whatever the grace"),
        (idle(0), GRACE, true, "between two messages"),
        (idle(119), GRACE, true, "a second inside the grace"),
        (idle(120), GRACE, false, "the grace is over"),
        (idle(86_400), GRACE, false, "idle for a day"),
        (idle(0), Duration::ZERO, false, "no grace: released at once"),
        (Starting, GRACE, false, "holds nothing yet"),
        (Draining, GRACE, false, "leaving anyway"),
    ];
    for (activity, grace, protected, why) in table {
        assert_eq!(
            wants_protection(activity, grace),
            protected,
            "{activity:?}, grace {grace:?}: {why}"
        );
    }
}

/// (instances, minimum, waiting, removals, why)
type RemovalRow = (Vec<Activity>, usize, usize, Vec<usize>, &'static str);

#[test]
fn only_idle_instances_past_the_grace_are_removed() {
    let table: Vec<RemovalRow> = vec![
        (vec![], 0, 0, vec![], "an empty fleet"),
        (vec![], 3, 5, vec![], "an empty fleet under its minimum"),
        (vec![idle(600)], 1, 0, vec![], "at the minimum"),
        (vec![idle(600)], 0, 0, vec![0], "a minimum of 0"),
        (
            vec![busy(10), idle(600)],
            1,
            0,
            vec![1],
            "one busy, one idle: the idle one goes",
        ),
        (
            vec![busy(3000), busy(10), busy(0)],
            0,
            0,
            vec![],
            "all busy: nobody, even above the minimum",
        ),
        (
            vec![idle(600), idle(60), idle(300)],
            0,
            0,
            vec![0, 2],
            "the one inside the grace stays",
        ),
        (
            vec![idle(300), idle(900), idle(600), busy(5)],
            1,
            0,
            vec![1, 2, 0],
            "longest idle first, the busy one counts towards the minimum",
        ),
        (
            vec![idle(300), idle(900), idle(600), idle(120)],
            2,
            0,
            vec![1, 2],
            "down to the minimum, the most recently idle stay",
        ),
        (
            vec![idle(300), idle(300), idle(300)],
            1,
            0,
            vec![0, 1],
            "ties: lower index first",
        ),
        (
            vec![idle(600), idle(600), idle(600), idle(600)],
            1,
            2,
            vec![0, 1],
            "one idle instance per waiting message stays",
        ),
        (
            vec![idle(600), idle(600)],
            0,
            10,
            vec![],
            "more waiting than the fleet holds",
        ),
        (
            vec![Starting, idle(600), idle(600)],
            0,
            1,
            vec![1, 2],
            "a starting instance takes the waiting message",
        ),
        (
            vec![Starting, Starting],
            0,
            0,
            vec![],
            "starting ones are never named",
        ),
        (
            vec![Draining, Draining, idle(600)],
            1,
            0,
            vec![],
            "draining ones do not count towards the minimum",
        ),
        (
            vec![Draining, idle(600), idle(600)],
            1,
            0,
            vec![1],
            "draining ones are never named",
        ),
        (
            vec![idle(600); 3],
            usize::MAX,
            usize::MAX,
            vec![],
            "no overflow",
        ),
    ];
    for (instances, minimum, waiting, removals, why) in table {
        let fleet = Fleet {
            instances: &instances,
            minimum,
            waiting,
            idle_grace: GRACE,
        };
        assert_eq!(
            choose_removals(&fleet),
            removals,
            "{instances:?}, min {minimum}, waiting {waiting}: {why}"
        );
    }
}

#[test]
fn removal_order_puts_idle_before_busy_and_the_least_unsaved_first() {
    // (instances, order, why)
    let table: Vec<(Vec<Activity>, Vec<usize>, &str)> = vec![
        (vec![], vec![], "nothing"),
        (
            vec![busy(10), idle(5)],
            vec![1, 0],
            "one busy, one idle: the idle one first",
        ),
        (
            vec![busy(3000), busy(600), busy(1200)],
            vec![1, 2, 0],
            "AKS: the least unsaved work first",
        ),
        (
            vec![busy(0), Starting, idle(0), Draining],
            vec![3, 2, 1, 0],
            "draining, idle, starting, busy",
        ),
        (
            vec![idle(60), idle(600), idle(60)],
            vec![1, 0, 2],
            "longest idle first, ties by index",
        ),
        (
            vec![busy(7), busy(7), Starting, Starting],
            vec![2, 3, 0, 1],
            "ties by index within a class",
        ),
    ];
    for (instances, order, why) in table {
        assert_eq!(removal_order(&instances), order, "{instances:?}: {why}");
    }
}

#[test]
fn deletion_cost_follows_the_removal_order() {
    // (activity, cost, why)
    let table = [
        (Draining, -1, "leaving: cheapest"),
        (idle(0), 0, "idle: 0"),
        (idle(86_400), 0, "idle for long: still 0"),
        (Starting, 0, "holds nothing yet"),
        (busy(0), 1, "busy, just saved: above every idle one"),
        (busy(1), 1, "a second unsaved"),
        (busy(1200), 1200, "20 minutes unsaved"),
        (
            Activity::Busy {
                unsaved: Duration::from_millis(1999),
            },
            1,
            "whole seconds",
        ),
        (
            busy(u64::from(u32::MAX)),
            i32::MAX,
            "beyond i32 seconds: the largest",
        ),
        (
            Activity::Busy {
                unsaved: Duration::MAX,
            },
            i32::MAX,
            "no overflow",
        ),
    ];
    for (activity, cost, why) in table {
        assert_eq!(deletion_cost(activity), cost, "{activity:?}: {why}");
    }
    // Across a mixed fleet, sorting by cost never puts a busy instance
    // before an idle one, nor more unsaved work before less.
    let fleet = [busy(900), idle(10), Draining, busy(30), Starting, idle(500)];
    let order = removal_order(&fleet);
    let costs: Vec<i32> = order.iter().map(|&i| deletion_cost(fleet[i])).collect();
    assert!(costs.windows(2).all(|w| w[0] <= w[1]), "{costs:?}");
}
