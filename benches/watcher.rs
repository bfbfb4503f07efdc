//! How fast does a notice become a cancelled token, and what does watching
//! cost while nothing happens?
//!
//! `cargo bench --bench watcher [-- --events N --interval 1 --idle 30]`
//!
//! Under `cargo test --all-targets` (no `--bench` flag) it runs a few-second
//! smoke version instead, so the benchmark cannot rot unnoticed.
//!
//! The emulator runs in a child process (this binary, re-executed with
//! `--serve-emulator`) so that the CPU time measured here is the watcher's
//! alone. Each figure is compared with a baseline measured in the same run:
//! the polling loop of the Scheduled Events documentation's Python sample
//! (sleep, then GET on a fresh connection, parse, look for a Preempt).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rand::Rng;
use spot_worker::imds::{ImdsClient, ImdsConfig, NoticePolicy, Watcher, WatcherConfig};
use spot_worker_imds_emulator::{Emulator, EmulatorConfig};
use spot_worker_testkit::bench::BenchArgs;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const VM: &str = "spotvmss_0";

struct Options {
    events: usize,
    interval: Duration,
    idle: Duration,
}

fn main() -> Result<()> {
    let args = BenchArgs::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.has("--serve-emulator") {
        return runtime.block_on(serve_emulator());
    }
    let options = parse_options(&args)?;
    runtime.block_on(run(options))
}

fn parse_options(args: &BenchArgs) -> Result<Options> {
    let mut options = if args.benchmarking() {
        Options {
            events: 60,
            interval: Duration::from_secs(1),
            idle: Duration::from_secs(30),
        }
    } else {
        Options {
            events: 2,
            interval: Duration::from_millis(250),
            idle: Duration::from_secs(1),
        }
    };
    args.each_flag(|flag, value| {
        match flag {
            "--events" => options.events = value.parse()?,
            "--interval" => options.interval = value.seconds()?,
            "--idle" => options.idle = value.seconds()?,
            _ => {}
        }
        Ok(())
    })?;
    if options.events == 0 {
        bail!("--events must be at least 1");
    }
    Ok(options)
}

/// Child mode: serve an emulator, print its URL, exit when stdin closes (the
/// parent is gone).
async fn serve_emulator() -> Result<()> {
    let running = Emulator::start(EmulatorConfig::for_vm(VM)).await?;
    println!("{}", running.url());
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await?;
    Ok(())
}

/// The emulator child; killed on drop.
struct EmulatorProcess {
    child: Child,
    url: String,
}

impl EmulatorProcess {
    fn spawn() -> Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--serve-emulator")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the emulator process")?;
        let stdout = child.stdout.take().context("the child's stdout")?;
        let mut url = String::new();
        BufReader::new(stdout).read_line(&mut url)?;
        Ok(EmulatorProcess {
            child,
            url: url.trim().to_owned(),
        })
    }
}

impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn run(options: Options) -> Result<()> {
    let emulator = EmulatorProcess::spawn()?;
    let control = reqwest::Client::builder().no_proxy().build()?;
    println!(
        "watcher benchmark: {} events, poll interval {:?}, idle window {:?}\n",
        options.events, options.interval, options.idle
    );

    let mut ours = Vec::new();
    let mut baseline = Vec::new();
    // Interleave the two so that machine noise hits both alike.
    for _ in 0..options.events {
        ours.push(
            notice_latency(&emulator.url, &control, options.interval, Poller::Watcher).await?,
        );
        baseline
            .push(notice_latency(&emulator.url, &control, options.interval, Poller::Naive).await?);
    }
    let ours = Summary::of(ours);
    let baseline = Summary::of(baseline);
    println!(
        "## Notice to cancelled token ({} events each)\n",
        options.events
    );
    println!("| poller | median | p90 | p99 | max |");
    println!("|---|---|---|---|---|");
    ours.row("spot-worker watcher");
    baseline.row("documented sample loop (baseline)");
    println!(
        "\nratio watcher/baseline: median {:.2}, p99 {:.2}; goal p99 <= interval + 50 ms = {} ms: {}\n",
        ours.median / baseline.median,
        ours.p99 / baseline.p99,
        options.interval.as_millis() + 50,
        if ours.p99 <= options.interval.as_secs_f64() * 1000.0 + 50.0 {
            "met"
        } else {
            "NOT met"
        }
    );

    let ours_cpu = idle_cpu(
        &emulator.url,
        options.interval,
        options.idle,
        Poller::Watcher,
    )
    .await?;
    let base_cpu = idle_cpu(&emulator.url, options.interval, options.idle, Poller::Naive).await?;
    println!(
        "## CPU while idle (nothing scheduled), per hour of polling every {:?}\n",
        options.interval
    );
    println!("| poller | CPU s / hour | % of one core |");
    println!("|---|---|---|");
    for (name, share) in [
        ("spot-worker watcher", ours_cpu),
        ("documented sample loop (baseline)", base_cpu),
    ] {
        println!(
            "| {name} | {:.2} | {:.4} % |",
            share * 3600.0,
            share * 100.0
        );
    }
    println!("\nratio watcher/baseline: {:.2}", ours_cpu / base_cpu);
    Ok(())
}

#[derive(Clone, Copy)]
enum Poller {
    /// spot-worker's watcher and default shutdown policy.
    Watcher,
    /// The loop of the documentation's sample.
    Naive,
}

/// Time from asking the emulator for a Preempt to the poller's token being
/// cancelled, with the event landing at a random point of the poll cycle.
async fn notice_latency(
    url: &str,
    control: &reqwest::Client,
    interval: Duration,
    poller: Poller,
) -> Result<Duration> {
    control
        .post(format!("{url}/emulator/reset"))
        .send()
        .await?
        .error_for_status()?;
    let (token, ready, stop) = start_poller(url, interval, poller).await?;
    ready.await?;
    let phase = rand::rng().random_range(Duration::ZERO..interval);
    tokio::time::sleep(phase).await;

    let started = Instant::now();
    control
        .post(format!("{url}/emulator/events"))
        .json(&serde_json::json!({ "event_type": "Preempt", "resources": [VM] }))
        .send()
        .await?
        .error_for_status()?;
    tokio::time::timeout(interval * 10, token.cancelled())
        .await
        .context("the poller never saw the Preempt")?;
    let latency = started.elapsed();
    stop.cancel();
    Ok(latency)
}

/// CPU share of one core spent by `poller` over `window` of idle polling.
async fn idle_cpu(url: &str, interval: Duration, window: Duration, poller: Poller) -> Result<f64> {
    let (_token, ready, stop) = start_poller(url, interval, poller).await?;
    ready.await?;
    let cpu_before = process_cpu_time();
    let wall_before = Instant::now();
    tokio::time::sleep(window).await;
    let cpu = process_cpu_time() - cpu_before;
    let wall = wall_before.elapsed();
    stop.cancel();
    Ok(cpu.as_secs_f64() / wall.as_secs_f64())
}

/// Starts a poller; returns the token it cancels on a Preempt for this VM, a
/// future resolved after its first successful poll, and its stop token.
async fn start_poller(
    url: &str,
    interval: Duration,
    poller: Poller,
) -> Result<(
    CancellationToken,
    impl std::future::Future<Output = Result<()>>,
    CancellationToken,
)> {
    let stop = CancellationToken::new();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
    let token = match poller {
        Poller::Watcher => {
            let client = ImdsClient::new(ImdsConfig::default().with_endpoint(url))?;
            let config = WatcherConfig {
                poll_interval: interval,
                vm_name: Some(VM.into()),
                ..WatcherConfig::default()
            };
            let mut watcher = Watcher::new(client, config);
            let shutdown = watcher.notice_signal(NoticePolicy::default());
            let running = watcher.spawn();
            let mut health = running.health();
            let stop = stop.clone();
            tokio::spawn(async move {
                if health.wait_for(|h| h.polls > 0).await.is_ok() {
                    let _ = ready_tx.send(());
                }
                stop.cancelled().await;
                running.stop().await;
            });
            shutdown.token().clone()
        }
        Poller::Naive => {
            let token = CancellationToken::new();
            tokio::spawn(naive_loop(
                format!("{url}/metadata/scheduledevents?api-version=2020-07-01"),
                interval,
                token.clone(),
                stop.clone(),
                ready_tx,
            ));
            token
        }
    };
    let ready = async move {
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .context("the poller's first poll")?
            .context("the poller stopped")
    };
    Ok((token, ready, stop))
}

/// The documentation's sample loop: sleep, GET on a new connection, parse,
/// look for a Preempt naming this VM.
async fn naive_loop(
    url: String,
    interval: Duration,
    token: CancellationToken,
    stop: CancellationToken,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let Ok(http) = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
    else {
        return;
    };
    let mut ready = Some(ready);
    loop {
        if let Ok(response) = http.get(&url).header("Metadata", "true").send().await
            && let Ok(document) = response.json::<serde_json::Value>().await
        {
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
            let preempted = document["Events"].as_array().is_some_and(|events| {
                events.iter().any(|e| {
                    e["EventType"] == "Preempt"
                        && e["Resources"]
                            .as_array()
                            .is_some_and(|r| r.iter().any(|name| name == VM))
                })
            });
            if preempted {
                token.cancel();
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Milliseconds, sorted.
struct Summary {
    median: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

impl Summary {
    fn of(samples: Vec<Duration>) -> Summary {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
        Summary {
            median: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: ms[ms.len() - 1],
        }
    }

    fn row(&self, name: &str) {
        println!(
            "| {name} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
            self.median, self.p90, self.p99, self.max
        );
    }
}
