//! `u3m stat`: one snapshot of every live u3m process (or one).

use crate::collect::scan_once;
use crate::error::CliError;
use crate::json::{self, ProcView};
use crate::StatArgs;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;
use u3m_core::shm::{unix_ns, Event, EventCursor, SegmentReader, Snapshot};

/// Snapshot and the last `n` events of one segment.
pub fn read(r: &SegmentReader, n: usize) -> (Snapshot, Vec<Event>, u64) {
    let snap = r.snapshot();
    let mut cur = EventCursor::from(snap.event_head.saturating_sub(n as u64));
    let mut t = r.tail(&mut cur, n);
    if cur.stuck_at.is_some() {
        // A record being written right now: give its writer a moment, once.
        std::thread::sleep(Duration::from_millis(2));
        let more = r.tail(&mut cur, n);
        t.events.extend(more.events);
        t.lost += more.lost;
    }
    // Only what happened up to the snapshot, so counts and events agree.
    t.events.retain(|e| e.seq < snap.event_head);
    (snap, t.events, t.lost)
}

pub fn main(a: &StatArgs) -> Result<ExitCode, CliError> {
    let dir = a.target.dir();
    let found = scan_once(dir.clone(), a.target.pid)?;
    let data: Vec<(Snapshot, Vec<Event>, u64)> =
        found.iter().map(|f| read(&f.reader, a.events)).collect();
    let views: Vec<ProcView> = data
        .iter()
        .map(|(s, e, l)| ProcView {
            snap: s,
            events: e,
            lost: *l,
        })
        .collect();
    let mut out = String::new();
    if a.json {
        out = serde_json::to_string_pretty(&json::document(&views, unix_ns()))
            .expect("JSON of plain values");
        out.push('\n');
    } else if views.is_empty() {
        out = format!("no u3m processes (segments in {})\n", dir.display());
    } else {
        // grouped by node, then rank (torchrun-style launches)
        for (n, (i, head)) in crate::ranks::grouped(views.iter().map(|v| v.snap))
            .into_iter()
            .enumerate()
        {
            if n > 0 {
                out.push('\n');
            }
            if let Some(h) = head {
                out.push_str(&h);
                out.push('\n');
            }
            out.push_str(&crate::table::render(&views[i]));
        }
    }
    let mut so = std::io::stdout().lock();
    match so.write_all(out.as_bytes()).and_then(|_| so.flush()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        // `u3m stat | head`: a closed pipe is not an error worth a message.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(err) => Err(CliError::Io {
            what: "writing to stdout",
            err,
        }),
    }
}
