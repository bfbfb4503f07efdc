//! A Spot availability trace in the format of `skypilot-org/spot-traces`
//! (the "Can't Be Late" paper's): `{"metadata": {"gap_seconds": N},
//! "data": [...]}`, one number per tick of `gap_seconds`, the Spot VMs
//! that could be had at that tick. One VM is available when it is 1 or
//! more.

use std::path::Path;

/// A trace: whether one Spot VM could be had, tick by tick.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The file's name without its folder, or the synthetic trace's.
    pub name: String,
    /// Seconds per tick.
    pub gap: f64,
    available: Vec<bool>,
}

impl Trace {
    /// Reads `path`; a clear error for a file that is not such a trace.
    pub fn read(path: &Path) -> Result<Trace, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let gap = json["metadata"]["gap_seconds"]
            .as_f64()
            .filter(|g| g.is_finite() && *g > 0.0)
            .ok_or_else(|| format!("{}: no positive metadata.gap_seconds", path.display()))?;
        let data = json["data"]
            .as_array()
            .filter(|d| !d.is_empty())
            .ok_or_else(|| format!("{}: no data array", path.display()))?;
        let available = data
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_f64()
                    .map(|n| n >= 1.0)
                    .ok_or_else(|| format!("{}: data[{i}] is not a number", path.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Ok(Trace {
            name,
            gap,
            available,
        })
    }

    /// A trace made here: `pattern` repeated, for the smoke run.
    pub fn synthetic(name: &str, gap: f64, pattern: &[bool]) -> Trace {
        Trace {
            name: name.to_string(),
            gap,
            available: pattern.to_vec(),
        }
    }

    /// Ticks in the file.
    pub fn len(&self) -> usize {
        self.available.len()
    }

    /// Whether Spot is available at `tick`. A job that runs past the end
    /// of the trace wraps around to its beginning (the GCP traces are
    /// shorter, 45.6 h, than a 52 h or 70 h deadline).
    pub fn at(&self, tick: usize) -> bool {
        self.available[tick % self.available.len()]
    }

    /// The share of ticks with Spot.
    pub fn availability(&self) -> f64 {
        self.available.iter().filter(|a| **a).count() as f64 / self.len() as f64
    }

    /// `n` start ticks spread evenly over the whole trace: tick
    /// ⌊i·len/n⌋ for i in 0..n.
    pub fn starts(&self, n: usize) -> Vec<usize> {
        (0..n).map(|i| i * self.len() / n.max(1)).collect()
    }

    /// The view of a job started at `start`: availability from its start.
    pub fn from(&self, start: usize) -> Window<'_> {
        Window { trace: self, start }
    }
}

/// A trace seen from one job's start: tick 0 is the start.
#[derive(Clone, Copy)]
pub struct Window<'a> {
    trace: &'a Trace,
    start: usize,
}

impl Window<'_> {
    /// Whether Spot is available during the job's tick `tick`.
    pub fn at(&self, tick: usize) -> bool {
        self.trace.at(self.start + tick)
    }

    /// Seconds per tick.
    pub fn gap(&self) -> f64 {
        self.trace.gap
    }

    /// The job's first tick in the trace's own count.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Whether Spot was available `back` ticks before the job's start
    /// (`back` at most [`Window::start`]: the trace's past, never its
    /// wrapped-around future).
    pub fn at_before(&self, back: usize) -> bool {
        self.trace.available[self.start - back]
    }
}
