//! `u3m top`: a live view. In a terminal it redraws in place (alternate
//! screen, q to quit); otherwise it prints plain lines every refresh.

use crate::collect::{Found, Scanner};
use crate::error::CliError;
use crate::human::{addr, bytes, clock, duration, percent, rate, rate_bytes};
use crate::table::{self, columns};
use crate::TopArgs;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use u3m_core::shm::layout::COPY_NAMES;
use u3m_core::shm::{unix_ns, Event, EventCursor, Snapshot};

const RECENT_EVENTS: usize = 8;
const HOT_SHOWN: usize = 3;

/// What top remembers of one process between refreshes.
struct Seen {
    /// The segment file this state belongs to (a reused pid gets a new one).
    file_id: (u64, u64),
    cursor: EventCursor,
    recent: VecDeque<Event>,
    /// Events of this refresh (plain mode prints only these).
    fresh: Vec<Event>,
    lost: u64,
    prev: Option<Snapshot>,
}

/// Per-second rates between two snapshots of the same process.
#[derive(Debug, Default, PartialEq)]
pub struct Rates {
    /// Hook name and calls/s, busiest first (only hooks that were called).
    pub calls: Vec<(String, f64)>,
    pub calls_total: f64,
    /// Per device index: operator launches/s and copied bytes/s.
    pub ops: BTreeMap<usize, f64>,
    pub copy_bps: BTreeMap<usize, f64>,
    /// u3m's own traffic, summed over devices (the writer keeps the
    /// process-wide figures on device 0): bytes/s into and out of HBM,
    /// fault-ins/s and evictions/s.
    pub tier: TierRates,
}

#[derive(Debug, Default, PartialEq, Clone, Copy)]
pub struct TierRates {
    pub in_bps: f64,
    pub out_bps: f64,
    pub faults_per_s: f64,
    pub evictions_per_s: f64,
}

pub fn rates(prev: &Snapshot, cur: &Snapshot) -> Option<Rates> {
    let dt = cur.taken_mono_ns.checked_sub(prev.taken_mono_ns)? as f64 / 1e9;
    if dt <= 0.0 || prev.pid != cur.pid || prev.start_mono_ns != cur.start_mono_ns {
        return None;
    }
    let mut r = Rates::default();
    for c in &cur.calls {
        let before = prev
            .calls
            .iter()
            .find(|p| p.id == c.id)
            .map_or(0, |p| p.count);
        let d = c.count.saturating_sub(before);
        if d > 0 {
            r.calls.push((c.name.clone(), d as f64 / dt));
            r.calls_total += d as f64 / dt;
        }
    }
    r.calls
        .sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    for d in &cur.devices {
        let p = prev.devices.iter().find(|p| p.index == d.index);
        let delta = |k: &str| d.get(k).saturating_sub(p.map_or(0, |p| p.get(k))) as f64 / dt;
        r.ops.insert(d.index, delta("launches.ops"));
        let copied: f64 = COPY_NAMES
            .iter()
            .map(|k| delta(&format!("copies.{k}.bytes")))
            .sum();
        r.copy_bps.insert(d.index, copied);
        r.tier.in_bps += delta("migrations.hbm.bytes_in");
        r.tier.out_bps += delta("migrations.hbm.bytes_out");
        r.tier.faults_per_s += delta("faults_in.count");
        r.tier.evictions_per_s += delta("evictions.count");
    }
    Some(r)
}

struct Top {
    scanner: Scanner,
    open: BTreeMap<u32, Found>,
    seen: HashMap<u32, Seen>,
    notes: Vec<String>,
}

/// One refresh's data for one process.
struct View {
    snap: Snapshot,
    rates: Option<Rates>,
}

impl Top {
    fn refresh(&mut self) -> Result<Vec<View>, CliError> {
        let notes = self.scanner.scan(&mut self.open)?;
        self.notes.extend(notes);
        self.seen.retain(|pid, _| self.open.contains_key(pid));
        let mut views = Vec::new();
        for (pid, f) in &self.open {
            let snap = f.reader.snapshot();
            if self.seen.get(pid).is_some_and(|s| s.file_id != f.file_id) {
                self.seen.remove(pid);
            }
            let s = self.seen.entry(*pid).or_insert_with(|| Seen {
                file_id: f.file_id,
                cursor: EventCursor::from(snap.event_head.saturating_sub(RECENT_EVENTS as u64)),
                recent: VecDeque::new(),
                fresh: Vec::new(),
                lost: 0,
                prev: None,
            });
            let t = f
                .reader
                .tail(&mut s.cursor, u3m_core::shm::layout::EVENT_CAPACITY);
            s.lost += t.lost;
            s.fresh = t.events;
            for e in &s.fresh {
                s.recent.push_back(e.clone());
            }
            while s.recent.len() > RECENT_EVENTS {
                s.recent.pop_front();
            }
            let r = s.prev.as_ref().and_then(|p| rates(p, &snap));
            s.prev = Some(snap.clone());
            views.push(View { snap, rates: r });
        }
        Ok(views)
    }
}

fn device_row(v: &View, d: &u3m_core::shm::reader::DeviceSnapshot) -> Vec<String> {
    let tier = |t: &str| {
        let (u, c) = (d.get(&format!("{t}.used")), d.get(&format!("{t}.capacity")));
        format!("{} / {} {}", bytes(u), bytes(c), percent(u, c))
    };
    let ops = v
        .rates
        .as_ref()
        .and_then(|r| r.ops.get(&d.index))
        .map_or("-".into(), |x| rate(*x));
    let copy = v
        .rates
        .as_ref()
        .and_then(|r| r.copy_bps.get(&d.index))
        .map_or("-".into(), |x| rate_bytes(*x));
    vec![
        d.index.to_string(),
        tier("hbm"),
        tier("dram"),
        tier("nvme"),
        ops,
        copy,
        d.monitor.level.name().to_string(),
        d.monitor.seconds_to_oom.map_or("-".into(), duration),
    ]
}

fn calls_rate_line(v: &View) -> String {
    match &v.rates {
        None => "-".into(),
        Some(r) if r.calls.is_empty() => "0".into(),
        Some(r) => {
            let parts: Vec<String> = r
                .calls
                .iter()
                .take(6)
                .map(|(n, x)| format!("{n} {}", rate(*x)))
                .collect();
            format!("{} total: {}", rate(r.calls_total), parts.join(" · "))
        }
    }
}

/// Whether u3m tiers this process (it publishes a virtual capacity then).
fn tiered(s: &Snapshot) -> bool {
    s.devices.iter().any(|d| d.get("hbm.virtual_capacity") > 0)
}

/// "to HBM 80.0 MiB/s · out of HBM 120.0 MiB/s · fault-ins 22/s · evictions 34/s"
fn tier_rate_line(v: &View) -> String {
    match &v.rates {
        None => "-".into(),
        Some(r) => {
            let mut line = format!(
                "to HBM {} · out of HBM {} · fault-ins {}/s · evictions {}/s",
                rate_bytes(r.tier.in_bps),
                rate_bytes(r.tier.out_bps),
                rate(r.tier.faults_per_s),
                rate(r.tier.evictions_per_s)
            );
            line += &hostmap_part(&v.snap);
            line += &discards_part(&v.snap);
            line
        }
    }
}

/// The host-mapped state (calls larger than HBM, read-once streams), when
/// in use: " · host-mapped 4.0 MiB · read-once 12 mapped, 340 reads in place".
fn hostmap_part(s: &Snapshot) -> String {
    let sum = |k: &str| s.devices.iter().map(|d| d.get(k)).sum::<u64>();
    let mut t = String::new();
    let mapped = sum("hostmap.bytes");
    if mapped > 0 {
        t += &format!(" · host-mapped {}", crate::human::bytes(mapped));
    }
    let (maps, reads) = (sum("hostmap.stream_maps"), sum("hostmap.stream_reads"));
    if maps + reads > 0 {
        t += &format!(" · read-once {maps} mapped, {reads} reads in place");
    }
    t
}

/// The program's discard hints (`u3m_discard`, U3M_TORCH_HINTS), once any
/// came: " · discarded 16 (32.0 MiB)".
fn discards_part(s: &Snapshot) -> String {
    match s.devices.iter().map(|d| d.get("discards")).sum::<u64>() {
        0 => String::new(),
        n => format!(" · {}", crate::table::discarded(n)),
    }
}

fn hot_line(s: &Snapshot, h: &u3m_core::shm::HotEntry) -> String {
    let classes = s.class_list(h.class_mask).join(",");
    format!(
        "{} {} dev{} heat {:.3} accesses {} [{}]",
        addr(h.addr),
        bytes(h.len),
        h.device,
        h.heat,
        h.accesses,
        classes
    )
}

fn event_line(e: &Event, start: u64) -> String {
    table::event_row(e, start).join(" ").trim_end().to_string()
}

/// The full-screen frame.
fn nobody(top: &Top) -> String {
    match top.scanner.only {
        Some(pid) => format!(
            "no u3m process with pid {pid} (segments in {})",
            top.scanner.dir.display()
        ),
        None => format!(
            "no u3m processes (segments in {})",
            top.scanner.dir.display()
        ),
    }
}

fn frame(top: &Top, views: &[View], interval: Duration) -> Vec<String> {
    let mut out = vec![format!(
        "u3m top · {} process{} · every {} · {} · q quits",
        views.len(),
        if views.len() == 1 { "" } else { "es" },
        duration(interval.as_secs_f64()),
        clock(unix_ns())
    )];
    if views.is_empty() {
        out.push(String::new());
        out.push(nobody(top));
    }
    for (i, head) in crate::ranks::grouped(views.iter().map(|v| &v.snap)) {
        let v = &views[i];
        let s = &v.snap;
        out.push(String::new());
        if let Some(h) = head {
            out.push(h);
        }
        out.push(format!(
            "{} · {}",
            table::process_header(s),
            table::config_line(s)
        ));
        let mut rows = vec![[
            "dev",
            "hbm used / capacity",
            "dram",
            "nvme",
            "ops/s",
            "copied/s",
            "level",
            "OOM in",
        ]
        .map(String::from)
        .to_vec()];
        rows.extend(s.devices.iter().map(|d| device_row(v, d)));
        out.extend(columns(&rows, "  ").lines().map(String::from));
        out.push(format!("  calls/s  {}", calls_rate_line(v)));
        if tiered(s) {
            out.push(format!("  tiering  {}", tier_rate_line(v)));
        }
        for (i, h) in s.hot.iter().take(HOT_SHOWN).enumerate() {
            out.push(format!(
                "  {}  {}",
                if i == 0 { "hot     " } else { "        " },
                hot_line(s, h)
            ));
        }
        if let Some(seen) = top.seen.get(&s.pid) {
            let lost = if seen.lost > 0 {
                format!(" ({} lost)", seen.lost)
            } else {
                String::new()
            };
            out.push(format!("  events{lost}"));
            for e in &seen.recent {
                out.push(format!("    {}", event_line(e, s.start_mono_ns)));
            }
        }
    }
    if !top.notes.is_empty() {
        out.push(String::new());
        for n in top.notes.iter().rev().take(3) {
            out.push(format!("note: {n}"));
        }
    }
    out
}

/// Plain lines of one refresh (not a terminal).
fn plain(top: &Top, views: &[View]) -> Vec<String> {
    let now = clock(unix_ns());
    let mut out = Vec::new();
    if views.is_empty() {
        out.push(format!("{now} {}", nobody(top)));
    }
    for (i, _) in crate::ranks::grouped(views.iter().map(|v| &v.snap)) {
        let v = &views[i];
        let s = &v.snap;
        // labels before the pid: `pid N dev D` stays one phrase for parsers
        let mut p = now.clone();
        for k in ["node", "rank", "local_rank", "world_size"] {
            if !s.label(k).is_empty() {
                p.push_str(&format!(" {k} {}", s.label(k)));
            }
        }
        p.push_str(&format!(" pid {}", s.pid));
        if s.devices.is_empty() {
            out.push(format!(
                "{p} no device used yet; calls/s {}",
                calls_rate_line(v)
            ));
        }
        for d in &s.devices {
            let r = device_row(v, d);
            out.push(format!(
                "{p} dev {} hbm {} dram {} nvme {} ops/s {} copied/s {} level {} oom {} calls/s {}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                r[5],
                r[6],
                r[7],
                calls_rate_line(v)
            ));
        }
        if tiered(s) {
            out.push(format!("{p} tiering {}", tier_rate_line(v)));
        }
        for h in s.hot.iter().take(HOT_SHOWN) {
            out.push(format!("{p} hot {}", hot_line(s, h)));
        }
        if let Some(seen) = top.seen.get(&s.pid) {
            for e in &seen.fresh {
                out.push(format!("{p} event {}", event_line(e, s.start_mono_ns)));
            }
        }
    }
    out
}

pub fn main(a: &TopArgs) -> Result<ExitCode, CliError> {
    let mut top = Top {
        scanner: Scanner::new(a.target.dir(), a.target.pid),
        open: BTreeMap::new(),
        seen: HashMap::new(),
        notes: Vec::new(),
    };
    let interval = Duration::from_millis(a.interval);
    if std::io::stdout().is_terminal() {
        tty::run(&mut top, interval, a.iterations)
    } else {
        run_plain(&mut top, interval, a.iterations)
    }
}

fn run_plain(
    top: &mut Top,
    interval: Duration,
    iterations: Option<u64>,
) -> Result<ExitCode, CliError> {
    let mut n = 0u64;
    loop {
        let views = top.refresh()?;
        for note in top.notes.drain(..) {
            eprintln!("u3m: {note}");
        }
        let mut so = std::io::stdout().lock();
        let mut text = plain(top, &views).join("\n");
        text.push('\n');
        match so.write_all(text.as_bytes()).and_then(|_| so.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            Err(err) => {
                return Err(CliError::Io {
                    what: "writing to stdout",
                    err,
                })
            }
        }
        n += 1;
        if iterations.is_some_and(|max| n >= max) {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(interval);
    }
}

mod tty {
    use super::*;
    use crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
    use crossterm::{cursor, execute, queue, style::Print, terminal};

    /// Restores the terminal however top ends (return, error, or a panic:
    /// release builds abort, so the panic hook restores it too).
    struct Screen;

    impl Screen {
        fn enter() -> std::io::Result<Screen> {
            terminal::enable_raw_mode()?;
            let prev = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                prev(info)
            }));
            execute!(
                std::io::stdout(),
                terminal::EnterAlternateScreen,
                cursor::Hide
            )?;
            Ok(Screen)
        }
    }

    fn restore() {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }

    impl Drop for Screen {
        fn drop(&mut self) {
            restore();
        }
    }

    fn io(err: std::io::Error) -> CliError {
        CliError::Io {
            what: "drawing on the terminal",
            err,
        }
    }

    fn draw(lines: &[String]) -> std::io::Result<()> {
        let (cols, rows) = terminal::size().unwrap_or((80, 24));
        let mut so = std::io::stdout().lock();
        for (i, l) in lines.iter().take(rows as usize).enumerate() {
            let cut: String = l.chars().take(cols as usize).collect();
            queue!(
                so,
                cursor::MoveTo(0, i as u16),
                Print(cut),
                terminal::Clear(terminal::ClearType::UntilNewLine)
            )?;
        }
        let used = lines.len().min(rows as usize) as u16;
        if used < rows {
            queue!(
                so,
                cursor::MoveTo(0, used),
                terminal::Clear(terminal::ClearType::FromCursorDown)
            )?;
        }
        so.flush()
    }

    pub fn run(
        top: &mut Top,
        interval: Duration,
        iterations: Option<u64>,
    ) -> Result<ExitCode, CliError> {
        let _screen = Screen::enter().map_err(io)?;
        let mut n = 0u64;
        loop {
            let views = top.refresh()?;
            draw(&frame(top, &views, interval)).map_err(io)?;
            n += 1;
            if iterations.is_some_and(|max| n >= max) {
                return Ok(ExitCode::SUCCESS);
            }
            let deadline = Instant::now() + interval;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !event::poll(left).map_err(io)? {
                    break;
                }
                match event::read().map_err(io)? {
                    TermEvent::Key(k) if k.kind != KeyEventKind::Release => {
                        let ctrl_c = k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL);
                        if ctrl_c
                            || matches!(
                                k.code,
                                KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc
                            )
                        {
                            return Ok(ExitCode::SUCCESS);
                        }
                    }
                    TermEvent::Resize(..) => break,
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use u3m_core::monitor::Level;
    use u3m_core::shm::layout::DEVICE_FIELDS;
    use u3m_core::shm::reader::{CallCount, DeviceSnapshot, MonitorSnapshot};

    fn snap(t_ns: u64, malloc: u64, ops: u64, h2d: u64) -> Snapshot {
        let mut values = vec![0; DEVICE_FIELDS.len()];
        values[u3m_core::shm::layout::field_index("launches.ops")] = ops;
        values[u3m_core::shm::layout::field_index("copies.h2d.bytes")] = h2d;
        // u3m's traffic grows with h2d in these snapshots: 2 MiB in, 3 out
        let f = u3m_core::shm::layout::field_index;
        values[f("migrations.hbm.bytes_in")] = h2d * 2;
        values[f("evictions.count")] = if h2d > 0 { 3 } else { 0 };
        Snapshot {
            pid: 7,
            labels: Default::default(),
            foreign_pid_ns: false,
            layout: (1, 0),
            writer_version: "x".into(),
            start_unix_ns: 0,
            start_mono_ns: 100,
            exiting: false,
            config: String::new(),
            devices: vec![DeviceSnapshot {
                index: 0,
                values,
                stall_buckets: Default::default(),
                monitor: MonitorSnapshot {
                    level: Level::Ok,
                    seconds_to_oom: None,
                    use_fraction: 0.0,
                    growth_bps: 0,
                    updated_ns: 0,
                },
            }],
            calls: vec![
                CallCount {
                    id: 0,
                    name: "aclrtMalloc".into(),
                    count: malloc,
                },
                CallCount {
                    id: 1,
                    name: "aclrtFree".into(),
                    count: 3,
                },
            ],
            calls_overflow: 0,
            class_names: vec![],
            hot: vec![],
            hot_published_ns: 0,
            hot_publishes: 0,
            event_head: 0,
            events_dropped: 0,
            taken_mono_ns: t_ns,
        }
    }

    #[test]
    fn rates_are_deltas_per_second() {
        let a = snap(1_000_000_000, 10, 100, 0);
        let b = snap(1_500_000_000, 60, 400, 1 << 20);
        let r = rates(&a, &b).unwrap();
        assert_eq!(
            r.calls,
            vec![("aclrtMalloc".to_string(), 100.0)],
            "unchanged hooks are left out"
        );
        assert_eq!(r.calls_total, 100.0);
        assert_eq!(r.ops[&0], 600.0);
        assert_eq!(r.copy_bps[&0], 2.0 * (1 << 20) as f64);
        assert_eq!(r.tier.in_bps, 4.0 * (1 << 20) as f64, "2 MiB in 0.5 s");
        assert_eq!(r.tier.evictions_per_s, 6.0);
        assert!(rates(&b, &a).is_none(), "time went backwards");
        let mut other = snap(2_000_000_000, 0, 0, 0);
        other.start_mono_ns = 5; // a new process with the same pid
        assert!(rates(&b, &other).is_none());
    }

    #[test]
    fn the_host_mapped_state_and_read_once_streams_are_shown_when_in_use() {
        let mut s = snap(1, 0, 0, 0);
        assert_eq!(hostmap_part(&s), "");
        let f = u3m_core::shm::layout::field_index;
        s.devices[0].values[f("hostmap.bytes")] = 4 << 20;
        s.devices[0].values[f("hostmap.stream_maps")] = 12;
        s.devices[0].values[f("hostmap.stream_reads")] = 340;
        assert_eq!(
            hostmap_part(&s),
            " · host-mapped 4.0 MiB · read-once 12 mapped, 340 reads in place"
        );
    }

    #[test]
    fn discards_are_shown_once_a_hint_came() {
        let mut s = snap(1, 0, 0, 0);
        assert_eq!(discards_part(&s), "");
        s.devices[0].values[u3m_core::shm::layout::field_index("discards")] = 16;
        assert_eq!(discards_part(&s), " · discarded 16 (32.0 MiB)");
    }
}
