//! Where generated events go: the caching allocator turns tensor requests
//! into `A` events for new segments, and operators, copies and memsets become
//! trace lines through the canonical writer. Counts what it wrote (for
//! `--sizes`, and so tests can check the mix of operator classes).

use std::io::{self, Write};

use u3m_core::opclass::{classify, OpClass};
use u3m_core::trace::{CopyKind, Event, Range, TraceWriter};

use super::alloc::{Caching, Tensor};
use super::Component;

/// Every operator type the generator writes, with the class it is meant to
/// have; `tests/synth.rs` checks `u3m_core::opclass::classify` agrees.
pub const OPS: &[(&str, OpClass)] = &[
    ("MatMul", OpClass::MatMul),
    ("BatchMatMul", OpClass::MatMul),
    ("FlashAttentionScore", OpClass::AttentionPrefill),
    ("FlashAttentionScoreGrad", OpClass::AttentionPrefill),
    ("IncreFlashAttention", OpClass::AttentionDecode),
    ("ReshapeAndCache", OpClass::AttentionDecode),
    ("RmsNorm", OpClass::NormSoftmax),
    ("RmsNormGrad", OpClass::NormSoftmax),
    ("Softmax", OpClass::NormSoftmax),
    ("SoftmaxGrad", OpClass::NormSoftmax),
    ("SwiGlu", OpClass::Activation),
    ("SwiGluGrad", OpClass::Activation),
    ("Add", OpClass::Elementwise),
    ("Muls", OpClass::Elementwise),
    ("RotaryPositionEmbedding", OpClass::Elementwise),
    ("RotaryPositionEmbeddingGrad", OpClass::Elementwise),
    ("DropoutGenMask", OpClass::Elementwise),
    ("DropoutDoMask", OpClass::Elementwise),
    ("Embedding", OpClass::Embedding),
    ("EmbeddingDenseBackward", OpClass::Embedding),
    ("CrossEntropyLoss", OpClass::Reduction),
    ("CrossEntropyLossGrad", OpClass::Reduction),
    ("ArgMax", OpClass::Reduction),
    ("ApplyAdamW", OpClass::Optimizer),
    ("Cast", OpClass::Layout),
];

/// Host staging addresses (opaque to the format; acl_replay gives each
/// distinct one a buffer as large as its largest copy).
pub const HOST_STAGE: u64 = 0x7f00_0000_0000;
pub const HOST_INPUT: u64 = 0x7f10_0000_0000;
pub const HOST_OUTPUT: u64 = 0x7f20_0000_0000;

pub struct Emit<'w> {
    out: Option<TraceWriter<Box<dyn Write + 'w>>>,
    err: Option<io::Error>,
    pub mem: Caching,
    pub events: u64,
    pub ops: u64,
    pub by_class: [u64; OpClass::COUNT],
    pub copy_bytes: u64,
    /// Write a '# free ADDR BYTES' comment at each free (synth --frees).
    pub frees: bool,
}

impl<'w> Emit<'w> {
    /// `out` None: a dry run (`--sizes`), only counted.
    pub fn new(out: Option<Box<dyn Write + 'w>>) -> io::Result<Emit<'w>> {
        let out = match out {
            Some(w) => Some(TraceWriter::new(w)?),
            None => None,
        };
        Ok(Emit {
            out,
            err: None,
            mem: Caching::new(),
            events: 0,
            ops: 0,
            by_class: [0; OpClass::COUNT],
            copy_bytes: 0,
            frees: false,
        })
    }

    fn write(&mut self, ev: Event) {
        self.events += 1;
        crate::progress::count(self.events);
        if let (Some(w), None) = (self.out.as_mut(), self.err.as_ref()) {
            if let Err(e) = w.event(&ev) {
                self.err = Some(e);
            }
        }
    }

    pub fn comment(&mut self, text: &str) {
        if let (Some(w), None) = (self.out.as_mut(), self.err.as_ref()) {
            if let Err(e) = w.comment(text) {
                self.err = Some(e);
            }
        }
    }

    /// A tensor from the caching allocator (an `A` event when it needed a new segment).
    pub fn alloc(&mut self, bytes: u64, comp: Component) -> Tensor {
        let (t, seg) = self.mem.alloc(bytes, comp);
        if let Some(s) = seg {
            self.write(Event::alloc(s.addr, s.bytes).with_tag(s.comp.tag()));
        }
        t
    }

    /// A persistent tensor, named in a comment so that readers of the trace
    /// (reports, tests) can tell what lives where inside the segments.
    pub fn named(&mut self, name: &str, bytes: u64, comp: Component) -> Tensor {
        let t = self.alloc(bytes, comp);
        self.comment(&format!(
            "tensor {name} {:#x} {} {}",
            t.addr,
            t.bytes,
            comp.tag()
        ));
        t
    }

    pub fn free(&mut self, t: Tensor) {
        if self.frees {
            self.comment(&format!("free {:#x} {}", t.addr, t.bytes));
        }
        self.mem.free(t);
    }

    pub fn op(&mut self, name: &'static str, ins: &[Range], outs: &[Range], flops: u64) {
        debug_assert!(OPS.iter().any(|(n, _)| *n == name), "{name} is not in OPS");
        self.ops += 1;
        self.by_class[classify(name).0 as usize] += 1;
        let mut ev = Event::op(name, ins, outs);
        if flops > 0 {
            ev = ev.with_flops(flops);
        }
        self.write(ev);
    }

    pub fn h2d(&mut self, dst: Range, host: u64) {
        self.copy_bytes += dst.bytes;
        self.write(Event::copy(CopyKind::H2D, dst.addr, host, dst.bytes));
    }

    pub fn d2h(&mut self, host: u64, src: Range) {
        self.copy_bytes += src.bytes;
        self.write(Event::copy(CopyKind::D2H, host, src.addr, src.bytes));
    }

    pub fn memset(&mut self, dst: Range) {
        self.write(Event::set(dst.addr, dst.bytes));
    }

    /// Flushes; the first write error, if any.
    pub fn flush(&mut self) -> io::Result<()> {
        if let Some(e) = self.err.take() {
            return Err(e);
        }
        match self.out.as_mut() {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}
