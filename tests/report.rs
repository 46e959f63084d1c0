//! `u3m report`: the HTML page of a replayed trace is self-contained (no
//! script, nothing fetched), and headless Chromium (Debian's package,
//! installed by ci/test.sh; `U3M_SKIP_BROWSER=1` skips the browser part)
//! renders it: the DOM it builds has the charts and tables with the expected
//! contents, and a screenshot is taken.

mod common;
use common::{scratch, target_dir};
use std::path::{Path, PathBuf};
use std::process::Command;

fn u3m() -> PathBuf {
    target_dir().join("u3m")
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn report(trace: &str, extra: &[&str], out: &Path) -> String {
    let o = Command::new(u3m())
        .arg("report")
        .arg(repo().join(trace))
        .args(extra)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read_to_string(out).unwrap()
}

fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Some(p),
        None if std::env::var_os("U3M_SKIP_BROWSER").is_some() => {
            eprintln!(
                "NOTICE: U3M_SKIP_BROWSER set and chromium not installed: browser checks skipped"
            );
            None
        }
        None => panic!(
            "chromium is not installed: run ci/test.sh as root (it installs Debian's chromium), \
             or set U3M_SKIP_BROWSER=1 to skip the browser checks"
        ),
    }
}

/// Headless Chromium with a fresh profile and no network (every host name
/// resolves to nothing): `--dump-dom` or `--screenshot=...`.
fn headless(chrome: &Path, profile: &Path, what: &[&str], page: &Path) -> std::process::Output {
    Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--host-resolver-rules=MAP * ~NOTFOUND",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(what)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium")
}

/// The element starting at `<tag id="id"` up to its closing tag.
fn element<'a>(dom: &'a str, tag: &str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<{tag} id=\"{id}\""))
        .unwrap_or_else(|| panic!("no <{tag} id={id}> in the DOM"));
    let end = dom[start..].find(&format!("</{tag}>")).unwrap() + start;
    &dom[start..end]
}

/// Cell texts of each body row of a table.
fn rows(table: &str) -> Vec<Vec<String>> {
    let body = table.split("<tbody>").nth(1).unwrap_or("");
    body.split("<tr>")
        .skip(1)
        .map(|r| {
            r.split("<td>")
                .skip(1)
                .map(|c| c.split("</td>").next().unwrap().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn report_renders_in_headless_chromium_with_hot_and_cold_allocations() {
    let dir = scratch("report");
    let page = dir.join("hotcold.html");
    let html = report(
        "tests/traces/replay/hotcold.trace",
        &["--hbm", "12M", "--top", "4"],
        &page,
    );
    // self-contained: no script, no stylesheet or image links, no URL but SVG's namespace
    for bad in ["<script", "<link", "src=", "@import", "url("] {
        assert!(!html.contains(bad), "{bad} in the page");
    }
    assert_eq!(
        html.matches("http").count(),
        html.matches("http://www.w3.org/2000/svg").count(),
        "a URL other than the SVG namespace"
    );
    let Some(chrome) = chromium() else {
        return;
    };
    let profile = dir.join("profile");
    let out = headless(&chrome, &profile, &["--dump-dom"], &page);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    // tier occupancy: HBM, DRAM, NVMe lines with a point per sample
    let occ = element(&dom, "svg", "occupancy-dev0");
    assert_eq!(occ.matches("<polyline").count(), 3, "{occ}");
    for name in ["HBM", "DRAM", "NVMe"] {
        assert!(occ.contains(&format!("data-name=\"{name}\"")), "{name}");
    }
    let points = occ
        .split("points=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(points.split(' ').count() > 20, "HBM line has {points}");
    let mig = element(&dom, "svg", "migrations");
    assert_eq!(mig.matches("<polyline").count(), 2);
    // the two hot weights are hottest and never evicted; the sweep's cold buffers are coldest and evicted
    let hot = rows(element(&dom, "table", "hottest"));
    assert_eq!(hot.len(), 4, "{hot:?}");
    assert_eq!(
        (hot[0][3].as_str(), hot[0][8].as_str()),
        ("hot", "0"),
        "{hot:?}"
    );
    let cold = rows(element(&dom, "table", "coldest"));
    assert_eq!(cold.len(), 4);
    for r in &cold {
        assert_eq!(r[3], "cold", "{cold:?}");
        assert!(
            r[8].parse::<u64>().unwrap() > 0,
            "a cold buffer never evicted: {cold:?}"
        );
    }
    let summary = element(&dom, "table", "summary");
    assert!(
        summary.contains("12.0 MiB") && summary.contains("predictive"),
        "{summary}"
    );
    assert!(!element(&dom, "td", "evictions").contains(">0 chunks"));

    // a screenshot of the rendered page
    let shot = dir.join("hotcold.png");
    let out = headless(
        &chrome,
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1100,1600",
        ],
        &page,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1100, 1600));
    assert!(
        png.len() > 30_000,
        "a {}-byte screenshot is too plain to hold the charts",
        png.len()
    );

    // one occupancy chart per device
    let page2 = dir.join("multidev.html");
    let html = report("tests/traces/multidev.trace", &[], &page2);
    assert!(html.contains("id=\"occupancy-dev0\"") && html.contains("id=\"occupancy-dev1\""));
    assert!(html.contains("unlimited (nothing migrates: pass --hbm)"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_malformed_trace_is_exit_3_with_the_line() {
    let dir = scratch("report-bad");
    let o = Command::new(u3m())
        .arg("report")
        .arg(repo().join("tests/traces/replay/malformed.trace"))
        .arg("-o")
        .arg(dir.join("x.html"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("u3m report: ") && err.contains("malformed.trace:4:"),
        "{err}"
    );
    assert!(!dir.join("x.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
