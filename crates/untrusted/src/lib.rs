//! # spot-worker-untrusted
//!
//! What someone else controls, handled so that it cannot be turned against
//! a worker: files in a directory another user, another worker or the
//! program may write to, and text that ends up in a log or on a terminal.
//!
//! - [`open`] opens a file without following a symbolic link or blocking
//!   (a FIFO with no writer, a device), and only if it is a regular file
//!   of an expected owner; [`read_at_most`] and [`read_whole`] read it
//!   with a cap, so `/dev/zero` or a huge file cannot exhaust memory.
//! - [`Dir`] walks a directory without following a link anywhere below
//!   it: each subdirectory and file is opened from the directory already
//!   open, so none can be swapped for a link to elsewhere on the way.
//! - [`escape_line`] and [`escape_text`] make text harmless to show:
//!   control characters (an ANSI escape sequence, a carriage return that
//!   overwrites a line, a line break forging a log record) and bidirectional
//!   overrides become `\u{..}`; [`escape_json`] does the same to JSON
//!   text as JSON's own `\uXXXX`.
//!
//! ```
//! use spot_worker_untrusted::{Owners, escape_line, read_whole};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("member");
//! std::fs::write(&path, "pid 7, queue \x1b[31mjobs")?;
//! let bytes = read_whole(&path, &Owners::Any, 256)?;
//! let text = String::from_utf8_lossy(&bytes);
//! assert_eq!(escape_line(&text), "pid 7, queue \\u{1b}[31mjobs");
//!
//! std::os::unix::fs::symlink("/dev/zero", dir.path().join("link"))?;
//! assert!(read_whole(&dir.path().join("link"), &Owners::Any, 256).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod dir;
mod escape;
mod open;

pub use dir::Dir;
pub use escape::{escape_bytes, escape_json, escape_line, escape_text};
pub use open::{Owners, UntrustedError, file_kind, open, read_at_most, read_whole};
