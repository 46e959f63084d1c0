//! Progress of long commands (`replay`, `synth`; `ab` reports per arm) on
//! stderr, only when stderr is a terminal: one line redrawn in place at most
//! ten times a second and cleared at the end, so a pipe or a log file never
//! sees it. The command then prints its one-line result as usual.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ON: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<State> = Mutex::new(State {
    label: String::new(),
    stage: String::new(),
    last: None,
    shown: false,
});

struct State {
    label: String,
    stage: String,
    last: Option<Instant>,
    shown: bool,
}

/// Starts reporting as `label` (e.g. "u3m replay") if stderr is a terminal.
pub fn start(label: &str) {
    ON.store(std::io::stderr().is_terminal(), Relaxed);
    if let Ok(mut s) = STATE.lock() {
        s.label = label.to_string();
    }
}

/// What is being done now; drawn at once.
pub fn stage(text: impl Into<String>) {
    if !ON.load(Relaxed) {
        return;
    }
    if let Ok(mut s) = STATE.lock() {
        s.stage = text.into();
        draw(&mut s, None);
    }
}

/// `done` of `total` units of the current stage (cheap: call it often).
#[inline]
pub fn tick(done: usize, total: usize) {
    if done % 256 != 0 || !ON.load(Relaxed) {
        return;
    }
    if let Ok(mut s) = STATE.lock() {
        if s.last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        draw(&mut s, Some((done, total)));
    }
}

/// `n` units done of an open-ended stage (shown as "… N events").
#[inline]
pub fn count(n: u64) {
    if n % 4096 != 0 || !ON.load(Relaxed) {
        return;
    }
    if let Ok(mut s) = STATE.lock() {
        if s.last
            .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        let text = format!("{}: {} {n} events", s.label, s.stage);
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[K{text}");
        let _ = e.flush();
        s.last = Some(Instant::now());
        s.shown = true;
    }
}

/// The line as drawn: "u3m replay: t.trace, predictive (3/5) 42%".
pub fn line(label: &str, stage: &str, done: Option<(usize, usize)>) -> String {
    match done {
        Some((d, t)) if t > 0 => format!("{label}: {stage} {}%", d * 100 / t),
        _ => format!("{label}: {stage}"),
    }
}

fn draw(s: &mut State, done: Option<(usize, usize)>) {
    let text = line(&s.label, &s.stage, done);
    put(s, &text);
}

fn put(s: &mut State, text: &str) {
    let mut e = std::io::stderr().lock();
    let _ = write!(e, "\r\x1b[K{text}");
    let _ = e.flush();
    s.last = Some(Instant::now());
    s.shown = true;
}

/// Clears the line (before the result or an error is printed).
pub fn clear() {
    if let Ok(mut s) = STATE.lock() {
        if s.shown {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
            s.shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn line_shows_the_stage_and_percent() {
        assert_eq!(
            super::line("u3m replay", "t.trace, lru (2/5)", Some((50, 200))),
            "u3m replay: t.trace, lru (2/5) 25%"
        );
        assert_eq!(
            super::line("u3m synth", "writing", None),
            "u3m synth: writing"
        );
    }
}
