//! `u3m exporter` against a real Prometheus (Debian's package): two processes
//! launched torchrun-style (RANK / LOCAL_RANK / WORLD_SIZE, one device each)
//! run mlp_train at 1.4x HBM under libu3m.so; Prometheus scrapes the exporter
//! every 250 ms and PromQL through its HTTP API must return one series per
//! rank with plausible values; `promtool check metrics` passes on a scrape;
//! the exporter labels each rank's series, `u3m stat` and `u3m top` group
//! the two by node and rank. The server part checks malformed requests and
//! a slow client.
//!
//! Needs `prometheus` and `promtool` (installed by ci/test.sh when run as
//! root); `U3M_SKIP_PROMETHEUS=1` skips the Prometheus parts where they
//! cannot be installed (the rank checks still run).

mod common;
use common::{app, libu3m, scratch, target_dir};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn u3m() -> PathBuf {
    target_dir().join("u3m")
}

/// Kills and reaps the child when the test ends, however it ends.
struct Reap(Child);
impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `u3m exporter` on a free loopback port over `dir`; returns it and
/// its address (read from its first stderr line).
fn exporter(dir: &Path) -> (Reap, String) {
    let mut c = Command::new(u3m())
        .args(["exporter", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start u3m exporter");
    let mut err = c.stderr.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\n") && err.read(&mut b).unwrap_or(0) == 1 {
        line.push(b[0]);
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    // keep draining stderr so the exporter never blocks on a full pipe
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (Reap(c), addr)
}

/// One HTTP/1.1 request (`raw`: the whole request head) and the response.
fn http_raw(addr: &str, raw: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_string(), body.to_string())
}

fn get(addr: &str, path: &str, accept: &str) -> (u16, String, String) {
    http_raw(
        addr,
        format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// PromQL instant query through Prometheus's HTTP API: (labels, value) per series.
fn promql(prom: &str, q: &str) -> Vec<(serde_json::Value, f64)> {
    let (code, _, body) = get(
        prom,
        &format!("/api/v1/query?query={}", urlencode(q)),
        "*/*",
    );
    assert_eq!(code, 200, "query {q}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{body}");
    v["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["metric"].clone(),
                r["value"][1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// `promql` once Prometheus has at least `n` series for `q`: a loaded
/// machine can delay the first scrapes by seconds, and a fixed sleep made
/// this test fail in CI with no series at all.
fn promql_n(prom: &str, q: &str, n: usize) -> Vec<(serde_json::Value, f64)> {
    let t0 = Instant::now();
    loop {
        let rows = promql(prom, q);
        if rows.len() >= n || t0.elapsed() > Duration::from_secs(60) {
            return rows;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// One value per rank label, sorted by rank.
fn by_rank(rows: Vec<(serde_json::Value, f64)>) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = rows
        .into_iter()
        .map(|(m, x)| (m["rank"].as_str().unwrap_or("").to_string(), x))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// `prometheus` and `promtool`, or None when the test is to be skipped.
fn prometheus_tools() -> Option<(PathBuf, PathBuf)> {
    let find = |n: &str| {
        std::env::var_os("PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(n))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.is_file())
    };
    match (find("prometheus"), find("promtool")) {
        (Some(p), Some(t)) => Some((p, t)),
        _ if std::env::var_os("U3M_SKIP_PROMETHEUS").is_some() => {
            eprintln!("U3M_SKIP_PROMETHEUS set and prometheus/promtool not installed: skipped");
            None
        }
        _ => panic!(
            "prometheus and promtool are not installed: run ci/test.sh as root (it installs Debian's \
             `prometheus`), or set U3M_SKIP_PROMETHEUS=1 to skip this test"
        ),
    }
}

/// Two ranks of a torchrun-style launch of mlp_train under libu3m.so, tier
/// mode, 1.4x HBM (each process has its own simulated device 0).
fn launch_ranks(dir: &Path, steps: &str) -> Vec<Reap> {
    (0..2)
        .map(|rank| {
            let mut c = Command::new(app("mlp_train"));
            c.args(["--footprint", "120M", "--steps", steps]);
            common::hermetic(&mut c);
            c.env("LD_PRELOAD", libu3m())
                .env("U3M_SHM_DIR", dir)
                .env("U3M_MODE", "tier")
                .env("ACLSIM_HBM_BYTES", "96M")
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_WORLD_SIZE", "2")
                .env("TORCHELASTIC_RUN_ID", "u3m-test")
                .env("POD_NAME", format!("train-{rank}"))
                .env("POD_NAMESPACE", "ml")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Reap(c.spawn().expect("start mlp_train"))
        })
        .collect()
}

/// Waits until `n` processes show up in the exporter's output.
fn wait_processes(addr: &str, n: usize) -> String {
    let t0 = Instant::now();
    loop {
        let (_, _, body) = get(addr, "/metrics", "text/plain");
        // every process has touched its device (its gauges are published)
        let devices = body
            .lines()
            .filter(|l| l.starts_with("u3m_resident_bytes{") && l.contains("tier=\"hbm\""))
            .count();
        if body.contains(&format!("\nu3m_processes {n}\n")) && devices == n {
            return body;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{n} processes never appeared:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn two_ranks_are_grouped_labelled_and_scraped_by_prometheus() {
    let tools = prometheus_tools();
    let dir = scratch("exporter-prom");
    let (_exp, addr) = exporter(&dir);
    let prom = tools
        .as_ref()
        .map(|(p, _)| start_prometheus(p, &dir, &addr));
    let t_start = common_unix_s();
    // long enough that neither rank ends before the exporter has seen both
    // move every counter the checks read (the ranks are held from there)
    let mut ranks = launch_ranks(&dir, "16");
    let body = wait_processes(&addr, 2);

    // every series of each rank carries its labels
    for r in 0..2 {
        let want = format!(
            "rank=\"{r}\",local_rank=\"{r}\",world_size=\"2\",local_world_size=\"2\",run_id=\"u3m-test\",pod=\"train-{r}\",namespace=\"ml\",device=\"0\",tier=\"hbm\"}}"
        );
        assert!(body.contains(&want), "no {want} in\n{body}");
    }
    // stat and top, mid-run: one node heading, rank 0 before rank 1
    let st = Command::new(u3m())
        .args(["stat", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let st = String::from_utf8_lossy(&st.stdout).into_owned();
    let node = u3m_core::shm::host_name();
    assert_eq!(st.matches(&format!("node {node}\n")).count(), 1, "{st}");
    let r0 = st
        .find("rank 0/2 (local 0)")
        .unwrap_or_else(|| panic!("{st}"));
    let r1 = st
        .find("rank 1/2 (local 1)")
        .unwrap_or_else(|| panic!("{st}"));
    assert!(r0 < r1, "{st}");
    let js = Command::new(u3m())
        .args(["stat", "--json", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let js: serde_json::Value = serde_json::from_slice(&js.stdout).unwrap();
    let mut labels: Vec<String> = js["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| format!("{} {}", p["labels"]["rank"], p["labels"]["pod"]))
        .collect();
    labels.sort();
    assert_eq!(labels, ["\"0\" \"train-0\"", "\"1\" \"train-1\""]);
    let top = Command::new(u3m())
        .args(["top", "--iterations", "1", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    for r in 0..2 {
        assert!(
            top.contains(&format!(
                " node {node} rank {r} local_rank {r} world_size 2 pid "
            )),
            "{top}"
        );
    }
    // the OpenMetrics flavour is what was asked for
    let (code, head, om) = get(
        &addr,
        "/metrics",
        "application/openmetrics-text; version=1.0.0",
    );
    assert_eq!(code, 200);
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(om.ends_with("# EOF\n") && om.contains("# TYPE u3m_migrated_bytes counter\n"));

    let Some(((_, promtool), (_prom, prom_addr))) = tools.zip(prom) else {
        for r in &mut ranks {
            assert!(r.0.wait().unwrap().success(), "a rank failed");
        }
        return;
    };
    // the exposition as scraped mid-run passes promtool's linter
    let mut lint = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    lint.stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let lint = lint.wait_with_output().unwrap();
    assert!(
        lint.status.success(),
        "promtool check metrics:\n{}{}\n{body}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    // Hold the ranks (SIGSTOP) once their counters have moved, until
    // Prometheus has stored every series the checks read: a rank's segment
    // goes away when it exits, and on a loaded machine the ranks could
    // otherwise end before the first scrape (seen in CI).
    wait_counters_moved(&addr, &mut ranks);
    signal(&ranks, libc::SIGSTOP);
    for q in RANK_SERIES {
        let t0 = Instant::now();
        while !(by_rank(promql(&prom_addr, q)).len() == 2
            && by_rank(promql(&prom_addr, q)).iter().all(|r| r.1 > 0.0))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "Prometheus never stored {q}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    signal(&ranks, libc::SIGCONT);
    prometheus_checks(&prom_addr, &mut ranks, t_start);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Debian's prometheus on a free loopback port scraping `target` every
/// 250 ms, once it is ready.
fn start_prometheus(prometheus: &Path, dir: &Path, target: &str) -> (Reap, String) {
    let pport = free_port();
    let prom_addr = format!("127.0.0.1:{pport}");
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\nscrape_configs:\n  - job_name: u3m\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let prom_log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let prom = Reap(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .stdout(Stdio::null())
            .stderr(prom_log)
            .spawn()
            .expect("start prometheus"),
    );
    let t0 = Instant::now();
    while get_ready(&prom_addr) != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "prometheus not ready:\n{}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (prom, prom_addr)
}

/// The per-rank series the Prometheus checks read, each > 0 for both ranks
/// by the time the ranks are held.
const RANK_SERIES: [&str; 6] = [
    "max_over_time(u3m_resident_bytes{tier=\"hbm\"}[5m])",
    "max_over_time(u3m_resident_bytes{tier=\"dram\"}[5m])",
    "max_over_time(u3m_migrated_bytes_total{tier=\"hbm\",direction=\"out\"}[5m])",
    "max_over_time(u3m_migrated_bytes_total{tier=\"hbm\",direction=\"in\"}[5m])",
    "max_over_time(u3m_fault_in_stall_seconds_count[5m])",
    "max_over_time(u3m_prefetch_misses_total[5m])",
];

fn signal(ranks: &[Reap], sig: i32) {
    for r in ranks {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(r.0.id() as i32, sig) };
    }
}

/// Waits until the exporter shows, for both ranks, every series in
/// RANK_SERIES above zero (read straight from the exporter, not Prometheus).
fn wait_counters_moved(addr: &str, ranks: &mut [Reap]) {
    let want = [
        ("u3m_resident_bytes{", "tier=\"hbm\""),
        ("u3m_resident_bytes{", "tier=\"dram\""),
        ("u3m_migrated_bytes_total{", "direction=\"out\""),
        ("u3m_migrated_bytes_total{", "direction=\"in\""),
        ("u3m_fault_in_stall_seconds_count{", ""),
        ("u3m_prefetch_misses_total{", ""),
    ];
    let t0 = Instant::now();
    loop {
        let (_, _, body) = get(addr, "/metrics", "text/plain");
        let moved = want.iter().all(|(name, has)| {
            (0..2).all(|r| {
                body.lines().any(|l| {
                    l.starts_with(name)
                        && l.contains(has)
                        && (!name.starts_with("u3m_migrated") || l.contains("tier=\"hbm\""))
                        && l.contains(&format!("rank=\"{r}\""))
                        && l.rsplit(' ')
                            .next()
                            .and_then(|v| v.parse::<f64>().ok())
                            .unwrap_or(0.0)
                            > 0.0
                })
            })
        });
        if moved {
            return;
        }
        for r in ranks.iter_mut() {
            if let Ok(Some(st)) = r.0.try_wait() {
                panic!("a rank ended ({st}) before its counters all showed:\n{body}");
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the ranks' counters never all moved:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After the ranks end: what Prometheus stored about them.
fn prometheus_checks(prom_addr: &str, ranks: &mut [Reap], t_start: f64) {
    let prom_addr = prom_addr.to_string();
    for r in ranks.iter_mut() {
        let st = r.0.wait().unwrap();
        assert!(st.success(), "a rank failed: {st}");
    }
    // let Prometheus scrape the exits once more
    std::thread::sleep(Duration::from_millis(600));
    let t_end = common_unix_s();

    assert_eq!(
        promql_n(&prom_addr, "max_over_time(up{job=\"u3m\"}[5m])", 1)[0].1,
        1.0
    );
    assert_eq!(
        promql_n(&prom_addr, "min_over_time(u3m_collection_success[5m])", 1)[0].1,
        1.0,
        "every scrape read every segment"
    );
    let mib = 1024.0 * 1024.0;
    let hbm = by_rank(promql_n(
        &prom_addr,
        "max_over_time(u3m_resident_bytes{tier=\"hbm\"}[5m])",
        2,
    ));
    assert_eq!(
        hbm.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["0", "1"],
        "{hbm:?}"
    );
    for (rank, v) in &hbm {
        assert!(*v > 48.0 * mib && *v <= 96.0 * mib, "rank {rank}: hbm {v}");
    }
    for (q, what) in [
        (
            "max_over_time(u3m_resident_bytes{tier=\"dram\"}[5m])",
            "bytes in DRAM",
        ),
        (
            "max_over_time(u3m_migrated_bytes_total{tier=\"hbm\",direction=\"out\"}[5m])",
            "bytes out of HBM",
        ),
        (
            "max_over_time(u3m_migrated_bytes_total{tier=\"hbm\",direction=\"in\"}[5m])",
            "bytes into HBM",
        ),
        (
            "max_over_time(u3m_fault_in_stall_seconds_count[5m])",
            "stalls",
        ),
        (
            "max_over_time(u3m_fault_in_stall_seconds_sum[5m])",
            "stall seconds",
        ),
        (
            "max_over_time(u3m_prefetch_misses_total[5m])",
            "demand fault-ins",
        ),
    ] {
        let v = by_rank(promql_n(&prom_addr, q, 2));
        assert_eq!(v.len(), 2, "{what}: {v:?}");
        assert!(v.iter().all(|r| r.1 > 0.0), "{what}: {v:?}");
    }
    // 132 MiB of allocations on a 96 MiB card
    for (rank, v) in by_rank(promql_n(
        &prom_addr,
        "max_over_time(u3m_oversubscription_ratio[5m])",
        2,
    )) {
        assert!(v > 1.2 && v < 1.6, "rank {rank}: ratio {v}");
    }
    // a rank's stalls can't be longer than its run
    for (rank, v) in by_rank(promql_n(
        &prom_addr,
        "max_over_time(u3m_fault_in_stall_seconds_sum[5m])",
        2,
    )) {
        assert!(v < t_end - t_start, "rank {rank}: {v} s of stall");
    }
    let last = by_rank(promql_n(
        &prom_addr,
        "max_over_time(u3m_last_update_timestamp_seconds[5m])",
        2,
    ));
    for (rank, v) in &last {
        assert!(
            *v >= t_start - 1.0 && *v <= t_end + 1.0,
            "rank {rank}: last update {v}"
        );
    }
    // the pod and run labels came through from each rank's environment
    let info = promql_n(&prom_addr, "max_over_time(u3m_process_info[5m])", 2);
    let mut pods: Vec<String> = info
        .iter()
        .map(|(m, _)| format!("{}/{} {}", m["namespace"], m["pod"], m["run_id"]).replace('"', ""))
        .collect();
    pods.sort();
    assert_eq!(pods, ["ml/train-0 u3m-test", "ml/train-1 u3m-test"]);
}

fn get_ready(addr: &str) -> u16 {
    match TcpStream::connect(addr) {
        Ok(_) => get(addr, "/-/ready", "*/*").0,
        Err(_) => 0,
    }
}

fn common_unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn exporter_answers_bad_requests_and_is_not_held_up_by_a_slow_client() {
    let dir = scratch("exporter-http");
    let (_exp, addr) = exporter(&dir);
    // a client that connects and sends half a request, then nothing
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    let t0 = Instant::now();
    let (code, head, body) = get(&addr, "/metrics", "text/plain");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "held up by the slow client"
    );
    assert_eq!(code, 200);
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(
        body.contains("\nu3m_processes 0\n") && body.contains("u3m_collection_success 1\n"),
        "{body}"
    );
    let (code, _, _) = http_raw(&addr, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(code, 200);
    assert_eq!(http_raw(&addr, b"POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(http_raw(&addr, b"GET /nope HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(
        http_raw(
            &addr,
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"
        )
        .0,
        400
    );
    assert_eq!(http_raw(&addr, b"GET /metrics\r\n\r\n").0, 400);
    let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    huge.extend(std::iter::repeat(b'a').take(20_000));
    assert_eq!(http_raw(&addr, &huge).0, 431);
    // the slow client gets a timeout answer, and the server still serves
    let mut rest = Vec::new();
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _ = slow.read_to_end(&mut rest);
    assert!(
        String::from_utf8_lossy(&rest).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
    assert_eq!(get(&addr, "/metrics", "text/plain").0, 200);
    // an unreadable file in the directory turns the success gauge to 0
    std::fs::write(dir.join("u3m.1"), vec![7u8; 4096]).unwrap();
    let (_, _, body) = get(&addr, "/metrics", "text/plain");
    assert!(body.contains("u3m_collection_success 0\n"), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}
