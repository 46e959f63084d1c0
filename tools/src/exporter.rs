//! `u3m exporter`: serves `/metrics` for every u3m process on the node, read
//! from their stats segments at each scrape, in the Prometheus text format
//! (0.0.4) or, when the scraper asks for it in `Accept`, OpenMetrics 1.0.
//! A small HTTP/1.x server on std::net: one thread per connection (at most
//! MAX_CONNS at once), read and write timeouts, bounded request size, so a
//! malformed request or a slow client gets an error or a timeout and never
//! holds the others up. docs/exporter.md lists the metrics.

use crate::collect::{Found, Scanner};
use crate::error::CliError;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use u3m_core::shm::layout::{LABEL_NAMES, STALL_BOUNDS, TIER_NAMES};
use u3m_core::shm::reader::DeviceSnapshot;
use u3m_core::shm::{mono_ns, unix_ns, Snapshot};

/// Default port: outside the Prometheus exporter range 9100-9999 (fully
/// allocated), clear of HAMi (9394/9395), DCGM (9400), npu-exporter (8082),
/// the kubelet and kube-proxy (10249-10259), NodePorts (30000-32767) and the
/// Linux ephemeral range (32768-60999).
pub const DEFAULT_PORT: u16 = 19420;

const MAX_CONNS: usize = 32;
const MAX_REQUEST: usize = 8192;
const IO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug)]
pub struct ExporterArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR:PORT", default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)))]
    pub listen: SocketAddr,
    /// Directory of the stats segments [default: $U3M_SHM_DIR or /dev/shm].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Output flavour, from the scraper's Accept header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Prometheus,
    OpenMetrics,
}

impl Format {
    pub fn from_accept(accept: &str) -> Format {
        if accept.contains("application/openmetrics-text") {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// One process as the exporter sees it at a scrape.
pub struct Proc {
    pub snap: Snapshot,
    /// Wall-clock seconds of the writer's last sign of life.
    pub last_update_s: f64,
}

/// The segments of a node, read at each scrape.
struct Collector {
    scanner: Scanner,
    open: BTreeMap<u32, Found>,
}

impl Collector {
    /// Every live process, and whether everything found could be read.
    fn collect(&mut self) -> (Vec<Proc>, bool) {
        let notes = match self.scanner.scan(&mut self.open) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("u3m exporter: {e}");
                return (Vec::new(), false);
            }
        };
        // a file skipped (another user's, another layout) is a partial failure
        let ok = !notes.iter().any(|n| n.starts_with("skipping"));
        for n in notes {
            eprintln!("u3m exporter: {n}");
        }
        let now_unix = unix_ns() as f64 / 1e9;
        let now_mono = mono_ns();
        let procs = self
            .open
            .values()
            .map(|f| {
                let snap = f.reader.snapshot();
                let last = snap.last_update_mono_ns(f.reader.newest_event_ns());
                Proc {
                    last_update_s: now_unix - now_mono.saturating_sub(last) as f64 / 1e9,
                    snap,
                }
            })
            .collect();
        (procs, ok)
    }
}

/// Prometheus label value escaping (backslash, quote, newline).
fn esc(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// A number as both formats accept it.
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Gauge,
    Counter,
    Histogram,
}

/// One metric family being written: its samples follow its HELP/TYPE.
struct Family {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    samples: Vec<(String, String, f64)>,
}

/// Builds the exposition of one scrape.
pub struct Exposition {
    fmt: Format,
    families: Vec<Family>,
}

impl Exposition {
    fn new(fmt: Format) -> Self {
        Exposition {
            fmt,
            families: Vec::new(),
        }
    }

    fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) -> &mut Family {
        if let Some(i) = self.families.iter().position(|f| f.name == name) {
            return &mut self.families[i];
        }
        self.families.push(Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        });
        self.families.last_mut().expect("just pushed")
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, labels: &str, v: f64) {
        self.family(name, Kind::Gauge, help)
            .samples
            .push((String::new(), labels.to_string(), v));
    }

    /// `name` without `_total`; the sample gets it.
    fn counter(&mut self, name: &'static str, help: &'static str, labels: &str, v: f64) {
        self.family(name, Kind::Counter, help).samples.push((
            "_total".into(),
            labels.to_string(),
            v,
        ));
    }

    fn histogram(
        &mut self,
        name: &'static str,
        help: &'static str,
        labels: &str,
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) {
        let f = self.family(name, Kind::Histogram, help);
        let mut cum = 0u64;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, c) in counts.iter().enumerate() {
            cum += c;
            let le = bounds.get(i).map_or("+Inf".to_string(), |b| num_le(*b));
            f.samples.push((
                "_bucket".into(),
                format!("{labels}{sep}le=\"{le}\""),
                cum as f64,
            ));
        }
        f.samples.push(("_sum".into(), labels.to_string(), sum));
        f.samples
            .push(("_count".into(), labels.to_string(), cum as f64));
    }

    fn finish(self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let (ty, typed_name) = match (f.kind, self.fmt) {
                (Kind::Gauge, _) => ("gauge", f.name.to_string()),
                (Kind::Histogram, _) => ("histogram", f.name.to_string()),
                // the text format names the counter with its suffix;
                // OpenMetrics names the family without it
                (Kind::Counter, Format::Prometheus) => ("counter", format!("{}_total", f.name)),
                (Kind::Counter, Format::OpenMetrics) => ("counter", f.name.to_string()),
            };
            let _ = writeln!(out, "# HELP {typed_name} {}", f.help);
            let _ = writeln!(out, "# TYPE {typed_name} {ty}");
            for (suffix, labels, v) in &f.samples {
                if labels.is_empty() {
                    let _ = writeln!(out, "{}{suffix} {}", f.name, num(*v));
                } else {
                    let _ = writeln!(out, "{}{suffix}{{{labels}}} {}", f.name, num(*v));
                }
            }
        }
        if self.fmt == Format::OpenMetrics {
            out.push_str("# EOF\n");
        }
        out
    }
}

/// A bucket bound as a float literal (OpenMetrics wants `le` to parse as one).
fn num_le(b: f64) -> String {
    let s = format!("{b}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

/// `pid="…",node="…",rank="…",…`: the labels every per-process series has
/// (empty values are absent to Prometheus).
fn proc_labels(s: &Snapshot) -> String {
    let mut l = format!("pid=\"{}\"", s.pid);
    for (k, v) in LABEL_NAMES.iter().zip(&s.labels) {
        let _ = write!(l, ",{k}=\"{}\"", esc(v));
    }
    l
}

/// The whole exposition for `procs`; `ok`: the collection read everything.
pub fn render(procs: &[Proc], ok: bool, fmt: Format) -> String {
    let mut x = Exposition::new(fmt);
    x.gauge(
        "u3m_collection_success",
        "1 if every stats segment found was read at this scrape, else 0",
        "",
        ok as u8 as f64,
    );
    x.gauge(
        "u3m_processes",
        "u3m processes whose stats segment was read",
        "",
        procs.len() as f64,
    );
    for p in procs {
        let s = &p.snap;
        let pl = proc_labels(s);
        x.gauge(
            "u3m_process_info",
            "a u3m process: its library version and segment layout (value 1)",
            &format!(
                "{pl},version=\"{}\",layout=\"{}.{}\",state=\"{}\"",
                esc(&s.writer_version),
                s.layout.0,
                s.layout.1,
                if s.exiting { "exiting" } else { "running" }
            ),
            1.0,
        );
        x.gauge(
            "u3m_last_update_timestamp_seconds",
            "wall-clock time of the process's last sign of life in its segment (hot-table publication, monitor update or event)",
            &pl,
            p.last_update_s,
        );
        x.gauge(
            "u3m_start_timestamp_seconds",
            "wall-clock time the process created its segment",
            &pl,
            s.start_unix_ns as f64 / 1e9,
        );
        for d in &s.devices {
            device(&mut x, &format!("{pl},device=\"{}\"", d.index), d);
        }
    }
    x.finish()
}

fn device(x: &mut Exposition, dl: &str, d: &DeviceSnapshot) {
    let g = |k: &str| d.get(k) as f64;
    for t in TIER_NAMES {
        let tl = format!("{dl},tier=\"{t}\"");
        x.gauge(
            "u3m_resident_bytes",
            "bytes held in each tier (hbm: device memory in use; dram: pinned host; nvme: swap files)",
            &tl,
            g(&format!("{t}.used")),
        );
        x.gauge(
            "u3m_tier_capacity_bytes",
            "physical HBM capacity, or the configured DRAM / NVMe tier limit",
            &tl,
            g(&format!("{t}.capacity")),
        );
        x.gauge(
            "u3m_tier_peak_bytes",
            "high-water mark of u3m_resident_bytes",
            &tl,
            g(&format!("{t}.peak")),
        );
        for (dir, cnt, byt) in [("in", "in", "bytes_in"), ("out", "out", "bytes_out")] {
            let ml = format!("{tl},direction=\"{dir}\"");
            x.counter(
                "u3m_migrated_chunks",
                "chunks moved into / out of each tier",
                &ml,
                g(&format!("migrations.{t}.{cnt}")),
            );
            x.counter(
                "u3m_migrated_bytes",
                "bytes moved into / out of each tier",
                &ml,
                g(&format!("migrations.{t}.{byt}")),
            );
        }
    }
    let cap = g("hbm.capacity");
    x.gauge(
        "u3m_virtual_capacity_bytes",
        "device capacity reported to the process (U3M_OVERSUB x HBM), 0 if not set",
        dl,
        g("hbm.virtual_capacity"),
    );
    x.gauge(
        "u3m_allocated_bytes",
        "bytes of live device allocations, as the process sees them",
        dl,
        g("allocs.bytes_live"),
    );
    x.gauge(
        "u3m_allocations",
        "live device allocations",
        dl,
        g("allocs.live"),
    );
    x.gauge(
        "u3m_oversubscription_ratio",
        "allocated bytes / physical HBM capacity (above 1: the process holds more than the card)",
        dl,
        if cap > 0.0 {
            g("allocs.bytes_live") / cap
        } else {
            0.0
        },
    );
    x.counter(
        "u3m_allocations_refused",
        "device allocations that failed",
        dl,
        g("allocs.failed"),
    );
    x.counter(
        "u3m_fault_ins",
        "chunks brought back to HBM before an access",
        dl,
        g("faults_in.count"),
    );
    x.counter(
        "u3m_evictions",
        "chunks evicted from HBM",
        dl,
        g("evictions.count"),
    );
    x.counter(
        "u3m_prefetch_hits",
        "prefetched chunks a call used before they left HBM",
        dl,
        g("prefetch.hits"),
    );
    x.counter(
        "u3m_prefetch_misses",
        "chunks a call had to wait for (demand fault-ins)",
        dl,
        g("prefetch.misses"),
    );
    x.counter(
        "u3m_prefetched_bytes",
        "bytes the background prefetch brought back ahead of use",
        dl,
        g("prefetch.bytes"),
    );
    x.gauge(
        "u3m_host_mapped_bytes",
        "managed memory host-mapped now (pinned host memory at its device addresses, read over the link)",
        dl,
        g("hostmap.bytes"),
    );
    x.counter(
        "u3m_host_maps",
        "chunks that became host-mapped for calls larger than HBM",
        dl,
        g("hostmap.maps"),
    );
    x.counter(
        "u3m_stream_maps",
        "read-once chunks host-mapped instead of copied in (U3M_HOST_MAP=probe or stream)",
        dl,
        g("hostmap.stream_maps"),
    );
    x.counter(
        "u3m_stream_reads",
        "reads of read-once chunks served in place instead of by a copy-in",
        dl,
        g("hostmap.stream_reads"),
    );
    x.counter(
        "u3m_discards",
        "chunks a discard hint marked as holding no data (they leave HBM without a copy-out)",
        dl,
        g("discards"),
    );
    x.counter(
        "u3m_calls_refused_oversize",
        "calls refused before launch: their memory cannot all be accessible at once",
        dl,
        g("refused_oversize"),
    );
    x.counter(
        "u3m_operator_launches",
        "operator launches (aclop, aclnn)",
        dl,
        g("launches.ops"),
    );
    x.histogram(
        "u3m_fault_in_stall_seconds",
        "time a call waited for its chunks to be made resident",
        dl,
        &STALL_BOUNDS,
        &d.stall_buckets,
        d.get("stall.ns") as f64 / 1e9,
    );
    x.gauge(
        "u3m_monitor_level",
        "HBM pressure level from the monitor: 0 ok, 1 warning, 2 critical",
        dl,
        d.monitor.level as u8 as f64,
    );
    if let Some(t) = d.monitor.seconds_to_oom {
        x.gauge(
            "u3m_seconds_to_oom",
            "monitor's predicted time until HBM is full (absent: no prediction)",
            dl,
            t,
        );
    }
}

/// What a request asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Get {
        path: String,
        accept: String,
        head: bool,
    },
    Bad(u16, &'static str),
}

/// Parses the request head (`bytes` up to the blank line).
pub fn parse_request(bytes: &[u8]) -> Request {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Request::Bad(400, "request is not UTF-8");
    };
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or("");
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Bad(400, "malformed request line");
    };
    if !version.starts_with("HTTP/1.") {
        return Request::Bad(400, "not HTTP/1.x");
    }
    let head = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Request::Bad(405, "only GET and HEAD"),
    };
    let mut accept = String::new();
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            if k.trim().eq_ignore_ascii_case("accept") {
                accept = v.trim().to_string();
            }
        } else if !l.is_empty() {
            return Request::Bad(400, "malformed header");
        }
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    Request::Get { path, accept, head }
}

/// Reads the request head: up to the blank line, at most MAX_REQUEST bytes.
fn read_head(s: &mut TcpStream) -> Result<Vec<u8>, (u16, &'static str)> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return Ok(buf);
        }
        if buf.len() > MAX_REQUEST {
            return Err((431, "request head too large"));
        }
        match s.read(&mut chunk) {
            Ok(0) => return Err((400, "connection closed mid-request")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return Err((408, "request timed out")),
        }
    }
}

fn respond(s: &mut TcpStream, code: u16, ctype: &str, body: &str, head: bool) {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut msg = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if code == 405 {
        msg.push_str("Allow: GET, HEAD\r\n");
    }
    msg.push_str("\r\n");
    if !head {
        msg.push_str(body);
    }
    let _ = s.write_all(msg.as_bytes());
    let _ = s.flush();
}

fn serve(mut s: TcpStream, col: &Mutex<Collector>) {
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(IO_TIMEOUT));
    let req = match read_head(&mut s) {
        Ok(b) => parse_request(&b),
        Err((code, why)) => Request::Bad(code, why),
    };
    match req {
        Request::Bad(code, why) => respond(&mut s, code, "text/plain", &format!("{why}\n"), false),
        Request::Get { path, accept, head } => match path.as_str() {
            "/metrics" => {
                let fmt = Format::from_accept(&accept);
                // a poisoned lock only means a scrape panicked: read anyway
                let (procs, ok) = col.lock().unwrap_or_else(|p| p.into_inner()).collect();
                respond(&mut s, 200, fmt.content_type(), &render(&procs, ok, fmt), head)
            }
            "/" => respond(
                &mut s,
                200,
                "text/html; charset=utf-8",
                "<html><head><title>u3m exporter</title></head><body><h1>u3m exporter</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n",
                head,
            ),
            _ => respond(&mut s, 404, "text/plain", "not found; try /metrics\n", head),
        },
    }
}

pub fn main(a: &ExporterArgs) -> Result<ExitCode, CliError> {
    let dir = a.dir.clone().unwrap_or_else(u3m_core::shm::default_dir);
    let listener = TcpListener::bind(a.listen).map_err(|err| CliError::Io {
        what: "cannot listen",
        err,
    })?;
    let addr = listener.local_addr().map_err(|err| CliError::Io {
        what: "cannot listen",
        err,
    })?;
    eprintln!(
        "u3m exporter: serving http://{addr}/metrics for the segments in {}",
        dir.display()
    );
    let col = Arc::new(Mutex::new(Collector {
        scanner: Scanner::new(dir, None),
        open: BTreeMap::new(),
    }));
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(mut s) = conn else {
            // out of descriptors or memory: let connections finish
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNS {
            active.fetch_sub(1, Ordering::AcqRel);
            let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
            respond(&mut s, 503, "text/plain", "too many connections\n", false);
            continue;
        }
        let (col, done) = (col.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("u3m-exporter-conn".into())
            .spawn(move || {
                serve(s, &col);
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::AcqRel);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_or_are_refused_with_a_status() {
        assert_eq!(
            parse_request(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: application/openmetrics-text; version=1.0.0"),
            Request::Get {
                path: "/metrics".into(),
                accept: "application/openmetrics-text; version=1.0.0".into(),
                head: false
            }
        );
        assert!(matches!(
            parse_request(b"HEAD / HTTP/1.0"),
            Request::Get { head: true, .. }
        ));
        assert_eq!(
            parse_request(b"POST /metrics HTTP/1.1"),
            Request::Bad(405, "only GET and HEAD")
        );
        assert!(matches!(
            parse_request(b"GET /metrics"),
            Request::Bad(400, _)
        ));
        assert!(matches!(
            parse_request(b"GET /metrics SPDY/3"),
            Request::Bad(400, _)
        ));
        assert!(matches!(parse_request(b"\xff\xfe"), Request::Bad(400, _)));
        assert!(matches!(
            parse_request(b"GET / HTTP/1.1\r\nno colon here"),
            Request::Bad(400, _)
        ));
        assert!(matches!(parse_request(b""), Request::Bad(400, _)));
    }

    #[test]
    fn formats_differ_in_counter_names_and_the_eof_marker() {
        let p = render(&[], true, Format::Prometheus);
        assert!(
            p.contains("# TYPE u3m_collection_success gauge\nu3m_collection_success 1\n"),
            "{p}"
        );
        assert!(!p.contains("# EOF"));
        let o = render(&[], false, Format::OpenMetrics);
        assert!(o.ends_with("# EOF\n"));
        assert!(o.contains("u3m_collection_success 0\n"));
        assert_eq!(
            Format::from_accept("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
            Format::OpenMetrics
        );
        assert_eq!(Format::from_accept("*/*"), Format::Prometheus);
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_inf() {
        let mut x = Exposition::new(Format::Prometheus);
        x.histogram("h", "help", "a=\"1\"", &[0.5, 1.0], &[2, 0, 3], 4.25);
        x.counter("c", "help", "", 7.0);
        let t = x.finish();
        assert!(t.contains("h_bucket{a=\"1\",le=\"0.5\"} 2\nh_bucket{a=\"1\",le=\"1.0\"} 2\nh_bucket{a=\"1\",le=\"+Inf\"} 5\nh_sum{a=\"1\"} 4.25\nh_count{a=\"1\"} 5\n"), "{t}");
        assert!(t.contains("# TYPE c_total counter\nc_total 7\n"), "{t}");
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(num_le(1e-5), "0.00001");
    }
}
