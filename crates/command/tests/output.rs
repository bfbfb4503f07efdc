//! The program's output in the worker's log and in the failure reason,
//! with a real program on a real Azurite: progress drawn with carriage
//! returns becomes records of its own, an error written after it is in the
//! log and in the poison record, and an over-long line keeps its end.

mod common;

use std::time::Duration;

use common::*;
use spot_worker_testkit::worker::Env;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_with_carriage_returns_and_the_error_after_it_are_kept() {
    let captured = Captured::install();
    let env = Env::start().await;
    env.queue.send("encode", Duration::ZERO).await.unwrap();
    // Like ffmpeg: progress overwritten with `\r` (about 40 KiB of it),
    // then an error after the last `\r`; and one line of 10 000 bytes on
    // stdout that ends in END.
    let script = "i=0; while [ $i -lt 2000 ]; do printf 'frame=%6d fps=25\\r' $i >&2; i=$((i+1)); done; \
                  printf 'av_interleaved_write_frame(): File too large\\r\\n' >&2; \
                  head -c 10000 /dev/zero | tr '\\0' x; echo END; exit 1";
    let handler = Observed::new(shell(&env, script));
    let record = poisoned_by(&env, 1, handler.clone()).await;

    assert!(
        record
            .last_error
            .ends_with("frame=  1999 fps=25\nav_interleaved_write_frame(): File too large"),
        "the last bytes written end the reason: {}",
        record.last_error
    );
    let lines = captured.lines();
    let error = lines
        .iter()
        .find(|line| line.contains("File too large") && line.contains("\"stderr\""))
        .unwrap_or_else(|| panic!("the error is not a log record of its own:\n{lines:#?}"));
    assert!(!error.contains("frame="), "{error}");
    let progress = lines
        .iter()
        .filter(|line| line.contains("frame=") && !line.contains("poison"))
        .count();
    assert!(
        (1..100).contains(&progress),
        "progress is paced, not 2000 records: {progress}"
    );
    assert!(
        lines.iter().any(|line| line.contains("frame=  1999")),
        "the last progress state is logged"
    );
    let long = lines
        .iter()
        .find(|line| line.contains("xxxEND"))
        .unwrap_or_else(|| panic!("the long line lost its end:\n{lines:#?}"));
    assert!(long.contains("bytes left out"), "{long}");
    // One event, one line: the poison WARN quotes the reason.
    let poison = lines
        .iter()
        .find(|line| line.contains("moved to the poison queue"))
        .expect("the poison WARN");
    assert!(poison.contains("File too large"), "{poison}");
}
