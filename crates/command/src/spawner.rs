//! No program outlives its runner: each program is started with a
//! parent-death signal (`PR_SET_PDEATHSIG` = SIGKILL, set between fork and
//! exec), so a runner killed with SIGKILL (the OOM killer, `kill -9`) takes
//! its programs with it instead of leaving them computing while their
//! messages are redelivered elsewhere.
//!
//! The kernel sends that signal when the *thread* that forked the program
//! exits, not the process. Tokio's blocking-pool threads exit after idling,
//! and a runtime's workers end with the runtime, so a program forked on one
//! of them could be killed in the middle of its job. Programs are therefore
//! forked on one thread of this module that lives as long as the process
//! (it waits for requests forever and is never joined), with the requesting
//! runtime entered so Tokio still waits for the child.
//!
//! Between fork and exec the child also sheds what it must not inherit
//! (`inherit.rs`), and only then asks for the parent-death signal: the
//! kernel clears that signal whenever the process's credentials change,
//! which is also why a program that runs `sudo -u` (or any set-user-ID
//! program) loses it for the rest of its run; `--program-user` switches
//! the user before the signal is asked for.

use std::io;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use tokio::process::{Child, Command};

use crate::inherit::Inheritance;
use crate::program_user::ProgramUser;
use tokio::sync::oneshot;

/// One program to start, on the runtime that will wait for it.
struct Request {
    command: Command,
    runtime: tokio::runtime::Handle,
    started: oneshot::Sender<io::Result<Child>>,
}

/// The spawning thread's mailbox, started on first use.
fn spawner() -> io::Result<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    if let Some(sender) = SPAWNER.get() {
        return Ok(sender.lock().unwrap_or_else(|p| p.into_inner()).clone());
    }
    let (sender, requests) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("spot-worker-spawner".into())
        .spawn(move || {
            // Ends only with the process: the sender lives in a static.
            for request in requests {
                let _entered = request.runtime.enter();
                let mut command = request.command;
                let started = crate::reaper::spawn_program(|| command.spawn());
                let _ = request.started.send(started);
            }
        })?;
    let kept = SPAWNER.get_or_init(|| Mutex::new(sender));
    Ok(kept.lock().unwrap_or_else(|p| p.into_inner()).clone())
}

/// Starts `command` with only what it should inherit and a parent-death
/// SIGKILL, forked on the thread that lives as long as the runner; Tokio
/// (the current runtime) waits for it, and the orphan sweep never reaps
/// it.
pub(crate) async fn spawn_tied_to_runner(
    mut command: Command,
    user: Option<ProgramUser>,
) -> io::Result<Child> {
    prepare_child(&mut command, user);
    let runtime = tokio::runtime::Handle::current();
    let (started, spawned) = oneshot::channel();
    spawner()?
        .send(Request {
            command,
            runtime,
            started,
        })
        .map_err(|_| io::Error::other("the spawning thread is gone"))?;
    spawned
        .await
        .map_err(|_| io::Error::other("the spawning thread dropped the request"))?
}

/// In the child, before exec: what it inherits (`inherit.rs`), its user
/// (`program_user.rs`), then the parent-death signal (which a change of
/// user would clear).
fn prepare_child(command: &mut Command, user: Option<ProgramUser>) {
    let inheritance = Inheritance::new();
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid has no arguments and cannot fail.
        let runner = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the forked child before exec and
        // calls only async-signal-safe system calls (rt_sigaction,
        // pthread_sigmask, close_range, fcntl, setgroups, setresgid,
        // setresuid, capset, prctl, getppid, kill), reading memory
        // allocated before the fork and writing none shared with the parent.
        unsafe {
            command.pre_exec(move || {
                inheritance.apply()?;
                if let Some(user) = &user {
                    user.switch()?;
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The runner died between fork and prctl: the signal was
                // never going to come, so act on it now.
                if libc::getppid() != runner {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (command, inheritance, user);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A program started for a thread that exits right after is not killed
    /// with that thread: it was forked on the spawning thread.
    #[test]
    fn a_program_outlives_the_thread_that_asked_for_it() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let go = dir.path().join("go");
        let script = format!(
            "i=0; while [ ! -f '{}' ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; exit 7",
            go.display()
        );
        let handle = runtime.handle().clone();
        // Asked for from a thread of its own, which then ends.
        let asking = std::thread::spawn(move || {
            handle.block_on(async {
                let mut command = Command::new("sh");
                command.args(["-c", &script]);
                spawn_tied_to_runner(command, None).await.unwrap()
            })
        });
        let mut child = asking.join().unwrap();
        std::fs::write(&go, b"").unwrap();
        let status = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(60), child.wait()).await })
            .unwrap()
            .unwrap();
        assert_eq!(
            status.code(),
            Some(7),
            "{status:?}: killed with the asking thread"
        );
    }
}
