//! The 12 operator classes (design.md §1) and the one table that maps operator
//! type names to them.
//!
//! Names come from three places: aclop types (`MatMulV2`, `ReduceSumD`,
//! `TransData`), aclnn operator entry points (`aclnnMatmul`,
//! `aclnnInplaceAdd`, `aclnnFlashAttentionScoreGrad`) and HCCL collectives
//! (`HcclAllReduce`). [`canonical`] strips the `aclnn` and `Inplace` prefixes
//! (and a `GetWorkspaceSize` suffix), then [`OpClass::of`] looks the name up
//! case-sensitively in a sorted table ([`EXACT`], binary search over bytes)
//! and, failing that, applies ordered substring rules ([`RULES`]) to the
//! ASCII-lowercased name, so the ~900 aclnn names and their `V2`/`Grad`/
//! `Backward` variants land in a sensible class; anything else is
//! [`OpClass::Other`]. Nothing allocates.
//!
//! Memory copies and memsets are [`OpClass::Layout`] (the hooks name them
//! `Memcpy` and `Memset`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Operator class: what kind of computation touched a range.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    /// GEMM-like: matmul, batched matmul, linear, grouped/quantised matmul,
    /// convolution, and matmul fused with a collective.
    MatMul = 0,
    /// Full-sequence attention: training forward and backward, inference prefill.
    AttentionPrefill = 1,
    /// Incremental attention over a KV cache (decode) and KV-cache writes.
    AttentionDecode = 2,
    /// Softmax and the normalisations (LayerNorm, RmsNorm, GroupNorm, BatchNorm).
    NormSoftmax = 3,
    /// Pointwise arithmetic, comparisons, quantisation, rotary embedding, dropout.
    Elementwise = 4,
    /// Activation functions and their gradients (ReLU, GELU, SiLU, SwiGLU, ...).
    Activation = 5,
    /// Reductions, scans, sorts, pooling and losses.
    Reduction = 6,
    /// Embedding lookup, gather, scatter, indexing.
    Embedding = 7,
    /// Optimizer steps (Adam, AdamW, SGD, ...), foreach ops, AMP scaling.
    Optimizer = 8,
    /// Data movement without arithmetic: copy, cast, transpose, concat,
    /// slice, pad, fill; memcpy and memset.
    Layout = 9,
    /// HCCL collectives and point-to-point transfers.
    Communication = 10,
    /// Anything the table does not know.
    Other = 11,
}

use OpClass::*;

impl OpClass {
    /// Number of classes.
    pub const COUNT: usize = 12;

    /// Every class, in discriminant order.
    pub const ALL: [OpClass; 12] = [
        MatMul,
        AttentionPrefill,
        AttentionDecode,
        NormSoftmax,
        Elementwise,
        Activation,
        Reduction,
        Embedding,
        Optimizer,
        Layout,
        Communication,
        Other,
    ];

    /// Short stable name (used in stats JSON and `u3m top`).
    pub const fn name(self) -> &'static str {
        match self {
            MatMul => "matmul",
            AttentionPrefill => "attn-prefill",
            AttentionDecode => "attn-decode",
            NormSoftmax => "norm-softmax",
            Elementwise => "elementwise",
            Activation => "activation",
            Reduction => "reduction",
            Embedding => "embedding-gather",
            Optimizer => "optimizer",
            Layout => "copy-layout",
            Communication => "communication",
            Other => "other",
        }
    }

    /// The class with discriminant `v`, if any.
    pub const fn from_u8(v: u8) -> Option<OpClass> {
        if (v as usize) < Self::COUNT {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }

    /// This class's bit in a [`ClassMask`].
    #[inline]
    pub const fn bit(self) -> u16 {
        1 << self as u8
    }

    /// Class of an operator type name (aclop type, aclnn entry point or HCCL
    /// call). Allocation-free; unknown names give [`OpClass::Other`].
    pub fn of(name: &str) -> OpClass {
        Self::of_bytes(name.as_bytes())
    }

    /// [`OpClass::of`] for raw bytes.
    pub fn of_bytes(name: &[u8]) -> OpClass {
        classify_canonical(canonical(name))
    }
}

/// A set of operator classes (bit `c` set = class `c` touched the range).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClassMask(pub u16);

impl ClassMask {
    pub fn contains(self, c: OpClass) -> bool {
        self.0 & c.bit() != 0
    }
    pub fn insert(&mut self, c: OpClass) {
        self.0 |= c.bit();
    }
    pub fn is_empty(self) -> bool {
        self.0 & 0x0fff == 0
    }
    pub fn len(self) -> u32 {
        (self.0 & 0x0fff).count_ones()
    }
    /// The classes in the set, in discriminant order.
    pub fn iter(self) -> impl Iterator<Item = OpClass> {
        OpClass::ALL.into_iter().filter(move |c| self.contains(*c))
    }
}

/// The name with the `aclnn` and `Inplace` prefixes and the
/// `GetWorkspaceSize` suffix removed: `aclnnInplaceAdd` -> `Add`.
pub fn canonical(name: &[u8]) -> &[u8] {
    let mut n = name;
    if let Some(rest) = n.strip_prefix(b"aclnn") {
        n = rest;
    }
    if let Some(rest) = n.strip_prefix(b"Inplace") {
        if !rest.is_empty() {
            n = rest;
        }
    }
    if let Some(rest) = n.strip_suffix(b"GetWorkspaceSize") {
        if !rest.is_empty() {
            n = rest;
        }
    }
    n
}

/// Stable 64-bit hash (FNV-1a) of an operator type's canonical name, so that
/// `aclnnInplaceAdd`, `aclnnAdd` and the aclop type `Add` are one operator
/// type. This is `Access::op_hash`, from which the heat table derives its
/// refcount (distinct operator types).
pub fn op_hash(name: &str) -> u64 {
    op_hash_bytes(name.as_bytes())
}

/// [`op_hash`] for raw bytes.
pub fn op_hash_bytes(name: &[u8]) -> u64 {
    fnv1a(canonical(name))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Class and hash of an operator type in one call, through a small lock-free
/// cache keyed by the hash, so that a name that only the substring rules
/// classify costs a hash and one load after its first launch.
pub fn classify(name: &str) -> (OpClass, u64) {
    classify_bytes(name.as_bytes())
}

/// [`classify`] for a name as raw bytes (a C string from a hook, without
/// its NUL); bytes that are not UTF-8 are fine.
pub fn classify_bytes(name: &[u8]) -> (OpClass, u64) {
    let canon = canonical(name);
    let h = fnv1a(canon);
    // Entry: the hash with its low 4 bits replaced by class+1 (0 = empty).
    let slot = &CACHE[(h >> 52) as usize & (CACHE_SLOTS - 1)];
    let e = slot.load(Relaxed);
    if e != 0 && (e ^ h) & !0xf == 0 {
        if let Some(c) = OpClass::from_u8((e & 0xf) as u8 - 1) {
            return (c, h);
        }
    }
    let c = classify_canonical(canon);
    slot.store((h & !0xf) | (c as u64 + 1), Relaxed);
    (c, h)
}

const CACHE_SLOTS: usize = 1024;
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: AtomicU64 = AtomicU64::new(0);
static CACHE: [AtomicU64; CACHE_SLOTS] = [EMPTY_SLOT; CACHE_SLOTS];

fn classify_canonical(n: &[u8]) -> OpClass {
    if let Ok(i) = EXACT.binary_search_by(|(k, _)| k.cmp(&n)) {
        return EXACT[i].1;
    }
    // Substring rules over the lowercased name; longer names are truncated
    // (no operator name comes near the limit).
    let mut buf = [0u8; 96];
    let len = n.len().min(buf.len());
    for (d, s) in buf.iter_mut().zip(&n[..len]) {
        *d = s.to_ascii_lowercase();
    }
    let lower = &buf[..len];
    for (needle, class) in RULES {
        if contains(lower, needle) {
            return *class;
        }
    }
    Other
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    if needle.len() > hay.len() {
        return false;
    }
    // First byte before the rest: most positions fail on it.
    (0..=hay.len() - needle.len()).any(|i| hay[i] == first && &hay[i + 1..i + needle.len()] == rest)
}

/// Ordered fallback rules: the first needle found in the lowercased canonical
/// name decides. Order matters where names combine words: attention before
/// matmul, matmul before collectives (`AllGatherMatmul` is compute),
/// `broadcastto` before `broadcast`, `clamp`/`maximum` before `max`,
/// `normal` (random) before `norm`, `rotary`/`rope` before `embedding`,
/// layout words (`pad`, `expand`, `cast`) before the short arithmetic words
/// they contain (`add`, `exp`).
pub const RULES: &[(&[u8], OpClass)] = &[
    (b"incre", AttentionDecode),
    (b"paged", AttentionDecode),
    (b"decode", AttentionDecode),
    (b"inferattention", AttentionDecode),
    (b"kvcache", AttentionDecode),
    (b"andcache", AttentionDecode),
    (b"attention", AttentionPrefill),
    (b"attn", AttentionPrefill),
    (b"matmul", MatMul),
    (b"gemm", MatMul),
    (b"bmm", MatMul),
    (b"addmm", MatMul),
    (b"convolution", MatMul),
    (b"conv1d", MatMul),
    (b"conv2d", MatMul),
    (b"conv3d", MatMul),
    (b"convtranspose", MatMul),
    (b"deconv", MatMul),
    (b"einsum", MatMul),
    (b"broadcastto", Layout),
    (b"allreduce", Communication),
    (b"allgather", Communication),
    (b"reducescatter", Communication),
    (b"alltoall", Communication),
    (b"hccl", Communication),
    (b"hcom", Communication),
    (b"broadcast", Communication),
    (b"sendrecv", Communication),
    (b"adam", Optimizer),
    (b"sgd", Optimizer),
    (b"momentum", Optimizer),
    (b"lamb", Optimizer),
    (b"adagrad", Optimizer),
    (b"adadelta", Optimizer),
    (b"rmsprop", Optimizer),
    (b"ftrl", Optimizer),
    (b"foreach", Optimizer),
    (b"nonfinite", Optimizer),
    (b"updatescale", Optimizer),
    (b"softmax", NormSoftmax),
    (b"layernorm", NormSoftmax),
    (b"rmsnorm", NormSoftmax),
    (b"groupnorm", NormSoftmax),
    (b"batchnorm", NormSoftmax),
    (b"instancenorm", NormSoftmax),
    (b"deepnorm", NormSoftmax),
    (b"rotary", Elementwise),
    (b"rope", Elementwise),
    (b"embedding", Embedding),
    (b"gather", Embedding),
    (b"scatter", Embedding),
    (b"index", Embedding),
    (b"take", Embedding),
    (b"onehot", Embedding),
    (b"maskedselect", Embedding),
    (b"relu", Activation),
    (b"gelu", Activation),
    (b"silu", Activation),
    (b"swiglu", Activation),
    (b"geglu", Activation),
    (b"glu", Activation),
    (b"sigmoid", Activation),
    (b"tanh", Activation),
    (b"softplus", Activation),
    (b"softsign", Activation),
    (b"hardswish", Activation),
    (b"mish", Activation),
    (b"swish", Activation),
    (b"elu", Activation),
    (b"threshold", Activation),
    (b"normal", Elementwise),
    (b"clamp", Elementwise),
    (b"maximum", Elementwise),
    (b"minimum", Elementwise),
    (b"norm", Reduction),
    (b"reduce", Reduction),
    (b"sum", Reduction),
    (b"mean", Reduction),
    (b"argmax", Reduction),
    (b"argmin", Reduction),
    (b"max", Reduction),
    (b"min", Reduction),
    (b"prod", Reduction),
    (b"cumsum", Reduction),
    (b"logsumexp", Reduction),
    (b"var", Reduction),
    (b"std", Reduction),
    (b"topk", Reduction),
    (b"sort", Reduction),
    (b"pool", Reduction),
    (b"loss", Reduction),
    (b"crossentropy", Reduction),
    (b"quantile", Reduction),
    (b"median", Reduction),
    (b"nonzero", Reduction),
    (b"unique", Reduction),
    (b"histc", Reduction),
    (b"bincount", Reduction),
    (b"copy", Layout),
    (b"cast", Layout),
    (b"transpose", Layout),
    (b"permute", Layout),
    (b"reshape", Layout),
    (b"view", Layout),
    (b"contiguous", Layout),
    (b"transdata", Layout),
    (b"concat", Layout),
    (b"stack", Layout),
    (b"split", Layout),
    (b"slice", Layout),
    (b"pad", Layout),
    (b"fill", Layout),
    (b"zero", Layout),
    (b"ones", Layout),
    (b"repeat", Layout),
    (b"tile", Layout),
    (b"expand", Layout),
    (b"flip", Layout),
    (b"roll", Layout),
    (b"narrow", Layout),
    (b"tril", Layout),
    (b"triu", Layout),
    (b"squeeze", Layout),
    (b"flatten", Layout),
    (b"assign", Layout),
    (b"clone", Layout),
    (b"arange", Layout),
    (b"linspace", Layout),
    (b"memcpy", Layout),
    (b"memset", Layout),
    (b"formatcast", Layout),
    (b"identity", Layout),
    (b"unfold", Layout),
    (b"diag", Layout),
    (b"pack", Layout),
    (b"add", Elementwise),
    (b"sub", Elementwise),
    (b"mul", Elementwise),
    (b"div", Elementwise),
    (b"pow", Elementwise),
    (b"exp", Elementwise),
    (b"log", Elementwise),
    (b"sqrt", Elementwise),
    (b"abs", Elementwise),
    (b"neg", Elementwise),
    (b"reciprocal", Elementwise),
    (b"sign", Elementwise),
    (b"floor", Elementwise),
    (b"ceil", Elementwise),
    (b"round", Elementwise),
    (b"trunc", Elementwise),
    (b"sin", Elementwise),
    (b"cos", Elementwise),
    (b"tan", Elementwise),
    (b"erf", Elementwise),
    (b"where", Elementwise),
    (b"select", Elementwise),
    (b"equal", Elementwise),
    (b"greater", Elementwise),
    (b"less", Elementwise),
    (b"logical", Elementwise),
    (b"bitwise", Elementwise),
    (b"lerp", Elementwise),
    (b"masked", Elementwise),
    (b"dropout", Elementwise),
    (b"isfinite", Elementwise),
    (b"isinf", Elementwise),
    (b"isnan", Elementwise),
    (b"nan", Elementwise),
    (b"square", Elementwise),
    (b"remainder", Elementwise),
    (b"fmod", Elementwise),
    (b"quant", Elementwise),
    (b"xlogy", Elementwise),
    (b"uniform", Elementwise),
    (b"bernoulli", Elementwise),
    (b"random", Elementwise),
];

/// Exact canonical names, sorted by bytes (checked at compile time).
pub const EXACT: &[(&[u8], OpClass)] = &[
    (b"Abs", Elementwise),
    (b"Acos", Elementwise),
    (b"Adam", Optimizer),
    (b"AdamW", Optimizer),
    (b"AdaptiveAvgPool2d", Reduction),
    (b"AdaptiveMaxPool2d", Reduction),
    (b"Add", Elementwise),
    (b"AddLayerNorm", NormSoftmax),
    (b"AddN", Elementwise),
    (b"AddRmsNorm", NormSoftmax),
    (b"AddV2", Elementwise),
    (b"Addbmm", MatMul),
    (b"Addcdiv", Elementwise),
    (b"Addcmul", Elementwise),
    (b"Addmm", MatMul),
    (b"Addmv", MatMul),
    (b"Adds", Elementwise),
    (b"All", Reduction),
    (b"AllGather", Communication),
    (b"AllGatherMatmul", MatMul),
    (b"AllReduce", Communication),
    (b"AllToAll", Communication),
    (b"AlltoAll", Communication),
    (b"AlltoAllV", Communication),
    (b"Amax", Reduction),
    (b"Amin", Reduction),
    (b"AmpForeachNonFiniteCheckAndUnscale", Optimizer),
    (b"AmpUpdateScale", Optimizer),
    (b"Any", Reduction),
    (b"ApplyAdaMax", Optimizer),
    (b"ApplyAdadelta", Optimizer),
    (b"ApplyAdagrad", Optimizer),
    (b"ApplyAdam", Optimizer),
    (b"ApplyAdamD", Optimizer),
    (b"ApplyAdamV2", Optimizer),
    (b"ApplyAdamW", Optimizer),
    (b"ApplyAdamWV2", Optimizer),
    (b"ApplyFtrl", Optimizer),
    (b"ApplyGradientDescent", Optimizer),
    (b"ApplyLamb", Optimizer),
    (b"ApplyMomentum", Optimizer),
    (b"ApplyRmsProp", Optimizer),
    (b"ApplyRotaryPosEmb", Elementwise),
    (b"ApplySgd", Optimizer),
    (b"Arange", Layout),
    (b"ArgMax", Reduction),
    (b"ArgMaxV2", Reduction),
    (b"ArgMin", Reduction),
    (b"Argmax", Reduction),
    (b"Argmin", Reduction),
    (b"Argsort", Reduction),
    (b"AsStrided", Layout),
    (b"AscendAntiQuant", Elementwise),
    (b"AscendDequant", Elementwise),
    (b"AscendQuant", Elementwise),
    (b"AscendQuantV2", Elementwise),
    (b"Asin", Elementwise),
    (b"Assign", Layout),
    (b"Atan", Elementwise),
    (b"Atan2", Elementwise),
    (b"AvgPool", Reduction),
    (b"AvgPool2d", Reduction),
    (b"Baddbmm", MatMul),
    (b"BatchMatMul", MatMul),
    (b"BatchMatMulV2", MatMul),
    (b"BatchMatMulV3", MatMul),
    (b"BatchMatmul", MatMul),
    (b"BatchNorm", NormSoftmax),
    (b"BatchNormBackward", NormSoftmax),
    (b"BatchNormElemt", NormSoftmax),
    (b"BatchNormStats", NormSoftmax),
    (b"BatchSendRecv", Communication),
    (b"Bernoulli", Elementwise),
    (b"BinaryCrossEntropy", Reduction),
    (b"BitwiseAndTensor", Elementwise),
    (b"BitwiseNot", Elementwise),
    (b"BitwiseOrTensor", Elementwise),
    (b"Bmm", MatMul),
    (b"Broadcast", Communication),
    (b"BroadcastTo", Layout),
    (b"Cast", Layout),
    (b"Cat", Layout),
    (b"Ceil", Elementwise),
    (b"Celu", Activation),
    (b"Clamp", Elementwise),
    (b"ClampMax", Elementwise),
    (b"ClampMaxTensor", Elementwise),
    (b"ClampMin", Elementwise),
    (b"ClampMinTensor", Elementwise),
    (b"ClampTensor", Elementwise),
    (b"Clone", Layout),
    (b"Concat", Layout),
    (b"ConcatD", Layout),
    (b"ConcatV2", Layout),
    (b"ConstantPadNd", Layout),
    (b"Contiguous", Layout),
    (b"Conv2D", MatMul),
    (b"Conv2DBackpropFilter", MatMul),
    (b"Conv2DBackpropInput", MatMul),
    (b"Conv2DTranspose", MatMul),
    (b"Conv3D", MatMul),
    (b"Conv3DBackpropFilter", MatMul),
    (b"Conv3DBackpropInput", MatMul),
    (b"ConvTbc", MatMul),
    (b"Convolution", MatMul),
    (b"ConvolutionBackward", MatMul),
    (b"Copy", Layout),
    (b"Cos", Elementwise),
    (b"Cosh", Elementwise),
    (b"CrossEntropyLoss", Reduction),
    (b"Cumprod", Reduction),
    (b"Cumsum", Reduction),
    (b"DeepNorm", NormSoftmax),
    (b"DeepNormGrad", NormSoftmax),
    (b"Diag", Layout),
    (b"Div", Elementwise),
    (b"DivMod", Elementwise),
    (b"Divs", Elementwise),
    (b"Dot", MatMul),
    (b"Dropout", Elementwise),
    (b"DropoutDoMask", Elementwise),
    (b"DropoutGenMask", Elementwise),
    (b"DynamicQuant", Elementwise),
    (b"DynamicQuantV2", Elementwise),
    (b"Einsum", MatMul),
    (b"Elu", Activation),
    (b"EluBackward", Activation),
    (b"Embedding", Embedding),
    (b"EmbeddingBag", Embedding),
    (b"EmbeddingDenseBackward", Embedding),
    (b"EmbeddingRenorm", Embedding),
    (b"Eq", Elementwise),
    (b"EqScalar", Elementwise),
    (b"EqTensor", Elementwise),
    (b"Equal", Elementwise),
    (b"Erf", Elementwise),
    (b"Erfc", Elementwise),
    (b"Erfinv", Elementwise),
    (b"Exp", Elementwise),
    (b"Exp2", Elementwise),
    (b"Expand", Layout),
    (b"Expm1", Elementwise),
    (b"FastGelu", Activation),
    (b"FastGeluBackward", Activation),
    (b"FastGeluGrad", Activation),
    (b"Fill", Layout),
    (b"FillScalar", Layout),
    (b"FillTensor", Layout),
    (b"Fills", Layout),
    (b"FlashAttentionScore", AttentionPrefill),
    (b"FlashAttentionScoreGrad", AttentionPrefill),
    (b"FlashAttentionScoreV2", AttentionPrefill),
    (b"FlashAttentionUnpaddingScoreGrad", AttentionPrefill),
    (b"FlashAttentionVarLenScore", AttentionPrefill),
    (b"Flatten", Layout),
    (b"Flip", Layout),
    (b"Floor", Elementwise),
    (b"FloorDivide", Elementwise),
    (b"Fmod", Elementwise),
    (b"Frac", Elementwise),
    (b"FullyConnection", MatMul),
    (b"FusedAdam", Optimizer),
    (b"FusedAdamW", Optimizer),
    (b"FusedInferAttentionScore", AttentionDecode),
    (b"FusedInferAttentionScoreV2", AttentionDecode),
    (b"GEMM", MatMul),
    (b"Gather", Embedding),
    (b"GatherElements", Embedding),
    (b"GatherNd", Embedding),
    (b"GatherV2", Embedding),
    (b"GatherV3", Embedding),
    (b"Ge", Elementwise),
    (b"GeGlu", Activation),
    (b"GeScalar", Elementwise),
    (b"GeTensor", Elementwise),
    (b"Gelu", Activation),
    (b"GeluBackward", Activation),
    (b"GeluGrad", Activation),
    (b"GeluV2", Activation),
    (b"Gemm", MatMul),
    (b"Glu", Activation),
    (b"GluBackward", Activation),
    (b"Greater", Elementwise),
    (b"GreaterEqual", Elementwise),
    (b"GroupNorm", NormSoftmax),
    (b"GroupNormBackward", NormSoftmax),
    (b"GroupNormSilu", NormSoftmax),
    (b"GroupedMatmul", MatMul),
    (b"GroupedMatmulV2", MatMul),
    (b"GroupedMatmulV3", MatMul),
    (b"GroupedMatmulV4", MatMul),
    (b"Gt", Elementwise),
    (b"GtScalar", Elementwise),
    (b"GtTensor", Elementwise),
    (b"HardSwish", Activation),
    (b"Hardsigmoid", Activation),
    (b"Hardswish", Activation),
    (b"Hardtanh", Activation),
    (b"HcclAllGather", Communication),
    (b"HcclAllReduce", Communication),
    (b"HcclAlltoAll", Communication),
    (b"HcclAlltoAllV", Communication),
    (b"HcclAlltoAllVC", Communication),
    (b"HcclBarrier", Communication),
    (b"HcclBatchSendRecv", Communication),
    (b"HcclBroadcast", Communication),
    (b"HcclRecv", Communication),
    (b"HcclReduce", Communication),
    (b"HcclReduceScatter", Communication),
    (b"HcclSend", Communication),
    (b"HcomAllGather", Communication),
    (b"HcomAllReduce", Communication),
    (b"HcomBroadcast", Communication),
    (b"HcomReceive", Communication),
    (b"HcomReduceScatter", Communication),
    (b"HcomSend", Communication),
    (b"Identity", Layout),
    (b"IncreFlashAttention", AttentionDecode),
    (b"IncreFlashAttentionV2", AttentionDecode),
    (b"IncreFlashAttentionV3", AttentionDecode),
    (b"IncreFlashAttentionV4", AttentionDecode),
    (b"Index", Embedding),
    (b"IndexAdd", Embedding),
    (b"IndexCopy", Embedding),
    (b"IndexFill", Embedding),
    (b"IndexPut", Embedding),
    (b"IndexPutImpl", Embedding),
    (b"IndexSelect", Embedding),
    (b"InstanceNorm", NormSoftmax),
    (b"IsFinite", Elementwise),
    (b"IsInf", Elementwise),
    (b"IsNan", Elementwise),
    (b"KvRmsNormRopeCache", AttentionDecode),
    (b"L1Loss", Reduction),
    (b"LayerNorm", NormSoftmax),
    (b"LayerNormBackward", NormSoftmax),
    (b"LayerNormGrad", NormSoftmax),
    (b"LayerNormGradV3", NormSoftmax),
    (b"LayerNormV3", NormSoftmax),
    (b"LayerNormV4", NormSoftmax),
    (b"Le", Elementwise),
    (b"LeScalar", Elementwise),
    (b"LeTensor", Elementwise),
    (b"LeakyRelu", Activation),
    (b"LeakyReluBackward", Activation),
    (b"Lerp", Elementwise),
    (b"Less", Elementwise),
    (b"LessEqual", Elementwise),
    (b"LinalgVectorNorm", Reduction),
    (b"Linear", MatMul),
    (b"Linspace", Layout),
    (b"Log", Elementwise),
    (b"Log10", Elementwise),
    (b"Log1p", Elementwise),
    (b"Log2", Elementwise),
    (b"LogSigmoid", Activation),
    (b"LogSoftmax", NormSoftmax),
    (b"LogSoftmaxBackward", NormSoftmax),
    (b"LogSoftmaxGrad", NormSoftmax),
    (b"LogSoftmaxV2", NormSoftmax),
    (b"LogicalAnd", Elementwise),
    (b"LogicalNot", Elementwise),
    (b"LogicalOr", Elementwise),
    (b"LogicalXor", Elementwise),
    (b"Logsumexp", Reduction),
    (b"Lt", Elementwise),
    (b"LtScalar", Elementwise),
    (b"LtTensor", Elementwise),
    (b"MaskedFill", Elementwise),
    (b"MaskedFillScalar", Elementwise),
    (b"MaskedFillTensor", Elementwise),
    (b"MaskedSelect", Embedding),
    (b"MatMul", MatMul),
    (b"MatMulV2", MatMul),
    (b"MatMulV3", MatMul),
    (b"Matmul", MatMul),
    (b"MatmulAllReduce", MatMul),
    (b"MatmulAllReduceAddRmsNorm", MatMul),
    (b"MatmulReduceScatter", MatMul),
    (b"Max", Reduction),
    (b"MaxDim", Reduction),
    (b"MaxPool", Reduction),
    (b"MaxPool2d", Reduction),
    (b"MaxPool3d", Reduction),
    (b"Maximum", Elementwise),
    (b"Mean", Reduction),
    (b"Memcpy", Layout),
    (b"Memset", Layout),
    (b"Min", Reduction),
    (b"MinDim", Reduction),
    (b"Minimum", Elementwise),
    (b"Mish", Activation),
    (b"Mm", MatMul),
    (b"MseLoss", Reduction),
    (b"Mul", Elementwise),
    (b"Muls", Elementwise),
    (b"MultiHeadAttention", AttentionPrefill),
    (b"Mv", MatMul),
    (b"NLLLoss", Reduction),
    (b"NanToNum", Elementwise),
    (b"Narrow", Layout),
    (b"Ne", Elementwise),
    (b"NeScalar", Elementwise),
    (b"NeTensor", Elementwise),
    (b"Neg", Elementwise),
    (b"NllLoss", Reduction),
    (b"NonFiniteCheck", Optimizer),
    (b"Nonzero", Reduction),
    (b"Norm", Reduction),
    (b"Normal", Elementwise),
    (b"NotEqual", Elementwise),
    (b"NpuFormatCast", Layout),
    (b"OneHot", Embedding),
    (b"Ones", Layout),
    (b"OnesLike", Layout),
    (b"Pack", Layout),
    (b"Pad", Layout),
    (b"PadV3", Layout),
    (b"PagedAttention", AttentionDecode),
    (b"Permute", Layout),
    (b"Pow", Elementwise),
    (b"PowTensorScalar", Elementwise),
    (b"PowTensorTensor", Elementwise),
    (b"Prelu", Activation),
    (b"Prod", Reduction),
    (b"PromptFlashAttention", AttentionPrefill),
    (b"PromptFlashAttentionV2", AttentionPrefill),
    (b"PromptFlashAttentionV3", AttentionPrefill),
    (b"QuantBatchMatmul", MatMul),
    (b"QuantMatmul", MatMul),
    (b"QuantMatmulV2", MatMul),
    (b"QuantMatmulV3", MatMul),
    (b"QuantMatmulV4", MatMul),
    (b"Range", Layout),
    (b"RealDiv", Elementwise),
    (b"Reciprocal", Elementwise),
    (b"Recv", Communication),
    (b"ReduceAll", Reduction),
    (b"ReduceAny", Reduction),
    (b"ReduceLogSumExp", Reduction),
    (b"ReduceMax", Reduction),
    (b"ReduceMean", Reduction),
    (b"ReduceMeanD", Reduction),
    (b"ReduceMin", Reduction),
    (b"ReduceProd", Reduction),
    (b"ReduceScatter", Communication),
    (b"ReduceSum", Reduction),
    (b"ReduceSumD", Reduction),
    (b"Relu", Activation),
    (b"Relu6", Activation),
    (b"ReluGrad", Activation),
    (b"Remainder", Elementwise),
    (b"Repeat", Layout),
    (b"RepeatInterleave", Layout),
    (b"Reshape", Layout),
    (b"ReshapeAndCache", AttentionDecode),
    (b"RmsNorm", NormSoftmax),
    (b"RmsNormGrad", NormSoftmax),
    (b"Roll", Layout),
    (b"RopeWithSinCosCache", Elementwise),
    (b"RotaryPositionEmbedding", Elementwise),
    (b"Round", Elementwise),
    (b"Rsqrt", Elementwise),
    (b"Rsub", Elementwise),
    (b"SWhere", Elementwise),
    (b"ScaledMaskedSoftmax", NormSoftmax),
    (b"ScaledMaskedSoftmaxBackward", NormSoftmax),
    (b"Scatter", Embedding),
    (b"ScatterAdd", Embedding),
    (b"ScatterElements", Embedding),
    (b"ScatterNd", Embedding),
    (b"ScatterNdUpdate", Embedding),
    (b"ScatterPaKvCache", AttentionDecode),
    (b"ScatterUpdate", Embedding),
    (b"ScatterValue", Embedding),
    (b"Select", Elementwise),
    (b"Selu", Activation),
    (b"Send", Communication),
    (b"Sgd", Optimizer),
    (b"Sigmoid", Activation),
    (b"SigmoidBackward", Activation),
    (b"SigmoidGrad", Activation),
    (b"Sign", Elementwise),
    (b"Silu", Activation),
    (b"SiluBackward", Activation),
    (b"SiluGrad", Activation),
    (b"Sin", Elementwise),
    (b"Sinh", Elementwise),
    (b"Slice", Layout),
    (b"SliceV2", Layout),
    (b"Softmax", NormSoftmax),
    (b"SoftmaxBackward", NormSoftmax),
    (b"SoftmaxCrossEntropyWithLogits", NormSoftmax),
    (b"SoftmaxGrad", NormSoftmax),
    (b"SoftmaxV2", NormSoftmax),
    (b"Softplus", Activation),
    (b"Softsign", Activation),
    (b"Sort", Reduction),
    (b"Split", Layout),
    (b"SplitD", Layout),
    (b"SplitTensor", Layout),
    (b"SplitV", Layout),
    (b"SplitWithSize", Layout),
    (b"Sqrt", Elementwise),
    (b"Square", Elementwise),
    (b"SquaredDifference", Elementwise),
    (b"Squeeze", Layout),
    (b"Stack", Layout),
    (b"Std", Reduction),
    (b"StdMeanCorrection", Reduction),
    (b"StridedSlice", Layout),
    (b"StridedSliceAssign", Layout),
    (b"Sub", Elementwise),
    (b"Subs", Elementwise),
    (b"Sum", Reduction),
    (b"SwiGlu", Activation),
    (b"SwiGluGrad", Activation),
    (b"Swiglu", Activation),
    (b"SwigluGrad", Activation),
    (b"Swish", Activation),
    (b"SwishGrad", Activation),
    (b"Take", Embedding),
    (b"Tan", Elementwise),
    (b"Tanh", Activation),
    (b"TanhBackward", Activation),
    (b"TanhGrad", Activation),
    (b"TensorMove", Layout),
    (b"Threshold", Activation),
    (b"Tile", Layout),
    (b"TopK", Reduction),
    (b"TopKV2", Reduction),
    (b"Topk", Reduction),
    (b"TransData", Layout),
    (b"Transpose", Layout),
    (b"TransposeD", Layout),
    (b"Tril", Layout),
    (b"Triu", Layout),
    (b"Trunc", Elementwise),
    (b"Uniform", Elementwise),
    (b"Unique", Reduction),
    (b"Unpack", Layout),
    (b"Unsqueeze", Layout),
    (b"Var", Reduction),
    (b"VarMean", Reduction),
    (b"ViewCopy", Layout),
    (b"WeightQuantBatchMatmul", MatMul),
    (b"WeightQuantBatchMatmulV2", MatMul),
    (b"Where", Elementwise),
    (b"Xlogy", Elementwise),
    (b"Zero", Layout),
    (b"Zeros", Layout),
    (b"ZerosLike", Layout),
];

const fn bytes_lt(a: &[u8], b: &[u8]) -> bool {
    let mut i = 0;
    while i < a.len() && i < b.len() {
        if a[i] != b[i] {
            return a[i] < b[i];
        }
        i += 1;
    }
    a.len() < b.len()
}

const fn sorted(t: &[(&[u8], OpClass)]) -> bool {
    let mut i = 1;
    while i < t.len() {
        if !bytes_lt(t[i - 1].0, t[i].0) {
            return false;
        }
        i += 1;
    }
    true
}

// Binary search needs strictly increasing keys; a mis-sorted edit fails the build.
const _: () = assert!(
    sorted(EXACT),
    "opclass::EXACT must be sorted by bytes, without duplicates"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_and_names_are_consistent() {
        for (i, c) in OpClass::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert_eq!(OpClass::from_u8(i as u8), Some(*c));
        }
        assert_eq!(OpClass::from_u8(12), None);
        let mut names: Vec<_> = OpClass::ALL.iter().map(|c| c.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 12);
    }

    #[test]
    fn exact_names() {
        let cases: &[(&str, OpClass)] = &[
            ("MatMul", MatMul),
            ("MatMulV2", MatMul),
            ("BatchMatMul", MatMul),
            ("BatchMatMulV2", MatMul),
            ("aclnnMm", MatMul),
            ("aclnnBmm", MatMul),
            ("aclnnAddmm", MatMul),
            ("aclnnInplaceAddmm", MatMul),
            ("aclnnMatmul", MatMul),
            ("Linear", MatMul),
            ("aclnnFlashAttentionScore", AttentionPrefill),
            ("aclnnPromptFlashAttention", AttentionPrefill),
            ("aclnnIncreFlashAttention", AttentionDecode),
            ("PagedAttention", AttentionDecode),
            ("Softmax", NormSoftmax),
            ("SoftmaxV2", NormSoftmax),
            ("LayerNorm", NormSoftmax),
            ("aclnnRmsNorm", NormSoftmax),
            ("Add", Elementwise),
            ("aclnnInplaceAdd", Elementwise),
            ("Sub", Elementwise),
            ("Mul", Elementwise),
            ("aclnnDiv", Elementwise),
            ("Relu", Activation),
            ("ReluGrad", Activation),
            ("aclnnGelu", Activation),
            ("aclnnSilu", Activation),
            ("aclnnSwiglu", Activation),
            ("ReduceSum", Reduction),
            ("ReduceMean", Reduction),
            ("ApplyAdam", Optimizer),
            ("ApplyAdamW", Optimizer),
            ("aclnnApplyAdamWV2", Optimizer),
            ("aclnnEmbedding", Embedding),
            ("GatherV2", Embedding),
            ("Cast", Layout),
            ("aclnnCast", Layout),
            ("Transpose", Layout),
            ("aclnnInplaceCopy", Layout),
            ("Memcpy", Layout),
            ("Memset", Layout),
            ("HcclAllReduce", Communication),
            ("Broadcast", Communication),
            ("BroadcastTo", Layout),
            ("Maximum", Elementwise),
            ("Max", Reduction),
            ("Normal", Elementwise),
            ("Norm", Reduction),
        ];
        for (n, c) in cases {
            assert_eq!(OpClass::of(n), *c, "{n}");
        }
    }

    #[test]
    fn fallback_rules() {
        let cases: &[(&str, OpClass)] = &[
            ("aclnnFlashAttentionScoreGradV2", AttentionPrefill),
            ("aclnnIncreFlashAttentionV5", AttentionDecode),
            ("aclnnGroupedMatmulSwigluQuant", MatMul),
            ("aclnnQuantMatmulAllReduceV2", MatMul),
            ("aclnnInplaceAddRmsNormQuant", NormSoftmax),
            ("aclnnMoeGatingTopKSoftmax", NormSoftmax),
            ("aclnnForeachAddcdivScalarList", Optimizer),
            ("aclnnRotaryPositionEmbeddingGrad", Elementwise),
            ("aclnnEmbeddingBagBackward", Embedding),
            ("aclnnIndexPutImplV2", Embedding),
            ("aclnnGeluBackwardV2", Activation),
            ("aclnnHardsigmoidBackward", Activation),
            ("aclnnReduceSumV2", Reduction),
            ("aclnnMaxPool2dWithIndices", Reduction),
            ("aclnnSoftmaxCrossEntropyWithLogitsV2", NormSoftmax),
            ("aclnnNLLLoss2d", Reduction),
            ("aclnnClampMaxV2", Elementwise),
            ("aclnnConstantPadNdV2", Layout),
            ("aclnnExpandV2", Layout),
            ("TransposeV2", Layout),
            ("aclnnInplaceFillDiagonal", Layout),
            ("aclnnAddcmulV2", Elementwise),
            ("aclnnLogicalAndV2", Elementwise),
            ("aclnnHcclAlltoAllV3", Communication),
            ("aclnnNormalTensorScalar", Elementwise),
            ("aclnnLinalgVectorNormV2", Reduction),
            ("Conv2DBackpropInputD", MatMul),
            ("ReduceSumDV2", Reduction),
            ("aclnnUpsampleBilinear2d", Other),
            ("aclnnSomethingNew", Other),
            ("", Other),
            ("aclnn", Other),
        ];
        for (n, c) in cases {
            assert_eq!(OpClass::of(n), *c, "{n}");
        }
    }

    #[test]
    fn exact_match_is_case_sensitive_and_rules_are_not() {
        // "matmul" is not an exact key, but the rules catch it in any case.
        assert_eq!(OpClass::of("MATMUL"), MatMul);
        assert_eq!(OpClass::of("mm"), Other); // only exact "Mm" is a matmul
        assert_eq!(OpClass::of_bytes(b"aclnnMatmul\xff"), MatMul);
        assert_eq!(OpClass::of("Mm"), MatMul);
    }

    #[test]
    fn every_exact_entry_is_found() {
        for (k, c) in EXACT {
            let s = std::str::from_utf8(k).unwrap();
            assert_eq!(OpClass::of(s), *c, "{s}");
            assert_eq!(OpClass::of(&format!("aclnn{s}")), *c, "aclnn{s}");
        }
        assert!(EXACT.len() > 400);
    }

    #[test]
    fn canonical_and_hash() {
        assert_eq!(canonical(b"aclnnInplaceAdd"), b"Add");
        assert_eq!(canonical(b"aclnnAddGetWorkspaceSize"), b"Add");
        assert_eq!(canonical(b"Inplace"), b"Inplace");
        assert_eq!(op_hash("aclnnInplaceAdd"), op_hash("Add"));
        assert_ne!(op_hash("Add"), op_hash("Sub"));
        // FNV-1a reference value for "a".
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn classify_cache_agrees_with_table() {
        let names = [
            "aclnnFooBarSoftmaxV9",
            "MatMulV2",
            "aclnnZzz",
            "aclnnInplaceAdd",
            "HcclSend",
        ];
        for _ in 0..3 {
            for n in names {
                let (c, h) = classify(n);
                assert_eq!(c, OpClass::of(n), "{n}");
                assert_eq!(h, op_hash(n));
                assert_eq!(classify_bytes(n.as_bytes()), (c, h));
            }
        }
    }

    #[test]
    fn class_mask() {
        let mut m = ClassMask::default();
        assert!(m.is_empty());
        m.insert(MatMul);
        m.insert(Other);
        assert!(m.contains(MatMul) && m.contains(Other) && !m.contains(Layout));
        assert_eq!(m.len(), 2);
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![MatMul, Other]);
    }

    #[test]
    fn lookup_cost() {
        // Reported, not asserted: the table runs once per operator launch.
        let names = [
            "MatMulV2",
            "aclnnInplaceAdd",
            "aclnnGroupedMatmulSwigluQuant",
            "aclnnUnknownOp",
        ];
        let n = 20_000;
        let t = std::time::Instant::now();
        let mut acc = 0u64;
        for i in 0..n {
            acc += OpClass::of(names[i % names.len()]) as u64;
        }
        let of_ns = t.elapsed().as_nanos() as f64 / n as f64;
        let t = std::time::Instant::now();
        for i in 0..n {
            acc += classify(names[i % names.len()]).0 as u64;
        }
        let cached_ns = t.elapsed().as_nanos() as f64 / n as f64;
        eprintln!("opclass: OpClass::of {of_ns:.0} ns/lookup, classify (cached) {cached_ns:.0} ns/lookup ({acc})");
    }
}
