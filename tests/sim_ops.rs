//! Operator side of the simulated runtime: aclop and aclnn operators on known
//! inputs checked against references computed here, the hash kernel's
//! properties, in-place and strided operands, error codes for bad input, MMU
//! faults on freed memory, injected op faults and the cost model's `flops`
//! attribute. Driven through tests/apps/optest_aclop.c and optest_aclnn.c.

mod common;

use common::{run, Run};

fn aclop(args: &[&str]) -> Run {
    run("optest_aclop", args, &[]).must_succeed()
}

fn aclnn(args: &[&str]) -> Run {
    run("optest_aclnn", args, &[]).must_succeed()
}

/// The float array a program printed as `key=v0,v1,...`.
fn arr(r: &Run, key: &str) -> Vec<f32> {
    let v = r
        .fact(key)
        .unwrap_or_else(|| panic!("no {key} in output:\n{}", r.stdout));
    v.split(',')
        .map(|x| {
            x.parse::<f32>()
                .unwrap_or_else(|e| panic!("{key}: bad float {x}: {e}"))
        })
        .collect()
}

fn int(r: &Run, key: &str) -> i64 {
    r.fact(key)
        .unwrap_or_else(|| panic!("no {key} in output:\n{}\nstderr:\n{}", r.stdout, r.stderr))
        .parse()
        .unwrap()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            err <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w} (err {err})"
        );
    }
}

/// y[m,n] = op(x1)[m,k] * op(x2)[k,n] in f64; op = transpose when flagged.
/// x1 is stored [k,m] when ta, x2 is stored [n,k] when tb.
fn matmul_ref(
    x1: &[f32],
    x2: &[f32],
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
) -> Vec<f64> {
    let mut y = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            for p in 0..k {
                let a = if ta { x1[p * m + i] } else { x1[i * k + p] };
                let b = if tb { x2[j * k + p] } else { x2[p * n + j] };
                s += a as f64 * b as f64;
            }
            y[i * n + j] = s;
        }
    }
    y
}

// ------------------------------------------------------------------ aclop

#[test]
fn matmul_all_transposes_match_reference() {
    let (m, k, n) = (5usize, 7usize, 3usize);
    for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let r = aclop(&["matmul", "5", "7", "3", &ta.to_string(), &tb.to_string()]);
        let (x1, x2, y) = (arr(&r, "x1"), arr(&r, "x2"), arr(&r, "y"));
        let want = matmul_ref(&x1, &x2, m, k, n, ta == 1, tb == 1);
        assert_close(&y, &want, 1e-5, &format!("MatMul ta={ta} tb={tb}"));
    }
}

#[test]
fn matmul_through_every_aclop_entry_point() {
    // aclopExecute, aclopCompileAndExecute and ...V2 run the same kernel as aclopExecuteV2
    let base = aclop(&["matmul", "4", "6", "5", "1", "0", "v2"]);
    let want = matmul_ref(&arr(&base, "x1"), &arr(&base, "x2"), 4, 6, 5, true, false);
    assert_close(&arr(&base, "y"), &want, 1e-5, "aclopExecuteV2");
    for api in ["v1", "compile", "compile2"] {
        let r = aclop(&["matmul", "4", "6", "5", "1", "0", api]);
        assert_eq!(
            arr(&r, "y"),
            arr(&base, "y"),
            "{api} differs from aclopExecuteV2"
        );
    }
}

#[test]
fn batch_matmul_with_adjoints() {
    let (b, m, k, n) = (3usize, 4usize, 5usize, 2usize);
    for (ta, tb) in [(0, 0), (1, 1), (0, 1)] {
        let r = aclop(&[
            "batchmatmul",
            "3",
            "4",
            "5",
            "2",
            &ta.to_string(),
            &tb.to_string(),
        ]);
        let (x1, x2, y) = (arr(&r, "x1"), arr(&r, "x2"), arr(&r, "y"));
        let mut want = Vec::new();
        for i in 0..b {
            want.extend(matmul_ref(
                &x1[i * m * k..(i + 1) * m * k],
                &x2[i * k * n..(i + 1) * k * n],
                m,
                k,
                n,
                ta == 1,
                tb == 1,
            ));
        }
        assert_close(&y, &want, 1e-5, &format!("BatchMatMul adj={ta},{tb}"));
    }
}

#[test]
fn elementwise_ops_broadcast() {
    // (op, x1 shape, x2 shape, y shape); the f32 result must be bit-exact
    let cases = [
        ("Add", "3x4", "3x4", "3x4"),
        ("Add", "3x4", "4", "3x4"),   // bias over rows
        ("Sub", "4", "3x4", "3x4"),   // symmetric: x1 is the suffix
        ("Mul", "2x3", "s", "2x3"),   // 1-element x2 (rank 0)
        ("Mul", "3x1", "1x4", "3x4"), // numpy-style both ways
    ];
    for (op, s1, s2, sy) in cases {
        let r = aclop(&["binary", op, s1, s2, sy]);
        let (x1, x2, y) = (arr(&r, "x1"), arr(&r, "x2"), arr(&r, "y"));
        let dims = |s: &str| -> Vec<usize> {
            if s == "s" {
                vec![]
            } else {
                s.split('x').map(|d| d.parse().unwrap()).collect()
            }
        };
        let (d1, d2, dy) = (dims(s1), dims(s2), dims(sy));
        let at = |x: &[f32], d: &[usize], idx: &[usize]| -> f32 {
            // broadcast index into x (right-aligned, size-1 dims repeat)
            let off = idx.len() - d.len();
            let mut flat = 0;
            for (i, &dd) in d.iter().enumerate() {
                flat = flat * dd + if dd == 1 { 0 } else { idx[off + i] };
            }
            x[flat]
        };
        let total: usize = dy.iter().product();
        assert_eq!(y.len(), total);
        for f in 0..total {
            let mut idx = vec![0; dy.len()];
            let mut rem = f;
            for i in (0..dy.len()).rev() {
                idx[i] = rem % dy[i];
                rem /= dy[i];
            }
            let (a, b) = (at(&x1, &d1, &idx), at(&x2, &d2, &idx));
            let want = match op {
                "Add" => a + b,
                "Sub" => a - b,
                _ => a * b,
            };
            assert_eq!(y[f], want, "{op} {s1} {s2} at {idx:?}");
        }
    }
}

#[test]
fn relu_and_relu_grad() {
    let r = aclop(&["relu", "33"]);
    let (x, y) = (arr(&r, "x"), arr(&r, "y"));
    assert!(x.iter().any(|v| *v < 0.0) && x.iter().any(|v| *v > 0.0));
    for (a, b) in x.iter().zip(&y) {
        assert_eq!(*b, a.max(0.0));
    }
    let r = aclop(&["relugrad", "33"]);
    let (g, f, y) = (arr(&r, "g"), arr(&r, "x"), arr(&r, "y"));
    for i in 0..g.len() {
        assert_eq!(y[i], if f[i] > 0.0 { g[i] } else { 0.0 }, "ReluGrad[{i}]");
    }
}

#[test]
fn softmax_is_stable_and_rows_sum_to_one() {
    let (rows, cols) = (4usize, 9usize);
    let r = aclop(&["softmax", "4", "9"]);
    let (x, y) = (arr(&r, "x"), arr(&r, "y"));
    for i in 0..rows {
        let row = &x[i * cols..(i + 1) * cols];
        let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let e: Vec<f64> = row.iter().map(|v| (*v as f64 - mx).exp()).collect();
        let s: f64 = e.iter().sum();
        let want: Vec<f64> = e.iter().map(|v| v / s).collect();
        let got = &y[i * cols..(i + 1) * cols];
        assert!(
            got.iter().all(|v| v.is_finite()),
            "row {i} not finite (max not subtracted?): {got:?}"
        );
        let sum: f64 = got.iter().map(|v| *v as f64).sum();
        assert!((sum - 1.0).abs() < 1e-5, "row {i} sums to {sum}");
        assert_close(got, &want, 1e-5, "Softmax");
    }
}

#[test]
fn reduce_sum_over_each_axis() {
    let d = [3usize, 4, 5];
    for axis in [0i64, 1, 2, -1, -3] {
        let r = aclop(&["reducesum", "3x4x5", &axis.to_string()]);
        let (x, y) = (arr(&r, "x"), arr(&r, "y"));
        let ax = if axis < 0 {
            (axis + 3) as usize
        } else {
            axis as usize
        };
        let outer: usize = d[..ax].iter().product();
        let inner: usize = d[ax + 1..].iter().product();
        let mut want = vec![0f64; outer * inner];
        for o in 0..outer {
            for i in 0..d[ax] {
                for n in 0..inner {
                    want[o * inner + n] += x[(o * d[ax] + i) * inner + n] as f64;
                }
            }
        }
        assert_close(&y, &want, 1e-5, &format!("ReduceSum axis {axis}"));
    }
}

#[test]
fn fill_writes_the_value_attr() {
    let r = aclop(&["fill", "10", "-3.25"]);
    assert_eq!(arr(&r, "y"), vec![-3.25f32; 10]);
}

#[test]
fn apply_adam_one_step_matches_formula() {
    let r = aclop(&["adam", "17"]);
    let (var, m, v, g) = (arr(&r, "var"), arr(&r, "m"), arr(&r, "v"), arr(&r, "g"));
    let s = arr(&r, "scalars");
    let (b1p, b2p, lr, b1, b2, eps) = (s[0], s[1], s[2], s[3], s[4], s[5]);
    let lr_t = lr * (1.0 - b2p).sqrt() / (1.0 - b1p);
    let (mut wv, mut wm, mut wvv) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..var.len() {
        let m1 = m[i] + (g[i] - m[i]) * (1.0 - b1);
        let v1 = v[i] + (g[i] * g[i] - v[i]) * (1.0 - b2);
        wm.push(m1 as f64);
        wvv.push(v1 as f64);
        wv.push((var[i] - lr_t * m1 / (v1.sqrt() + eps)) as f64);
    }
    assert_close(&arr(&r, "m_out"), &wm, 1e-6, "m");
    assert_close(&arr(&r, "v_out"), &wvv, 1e-6, "v");
    assert_close(&arr(&r, "var_out"), &wv, 1e-6, "var");
    // the update is real: var moved
    assert!(arr(&r, "var_out").iter().zip(&var).all(|(a, b)| a != b));
}

#[test]
fn alias_op_types_compute_what_they_stand_for() {
    let r = aclop(&["aliases"]);
    for alias in ["MatMulV2", "BatchMatMulV2", "AddV2", "Softmax", "Div"] {
        assert_eq!(
            int(&r, &format!("alias_{alias}_same")),
            1,
            "{alias}:\n{}",
            r.stdout
        );
    }
}

#[test]
fn hash_kernel_is_deterministic_and_sees_every_byte() {
    let r = aclop(&["hash"]);
    for key in [
        "same0",
        "same1",
        "flip_tail0",
        "flip_tail1",
        "flip_mid0",
        "flip_mid1",
        "restored",
        "outputs_differ",
        "type_matters",
        "bytes_matmul_hashed",
    ] {
        assert_eq!(int(&r, key), 1, "{key}:\n{}", r.stdout);
    }
    // and across processes
    let again = aclop(&["hash"]);
    assert_eq!(r.fact("hash0"), again.fact("hash0"));
    assert_eq!(r.fact("hash1"), again.fact("hash1"));
}

#[test]
fn in_place_operators_read_inputs_before_writing() {
    let r = aclop(&["inplace"]);
    assert_eq!(
        arr(&r, "add_inplace"),
        vec![2.0, -4.0, 7.0, 8.0, 10.0, -12.0]
    );
    let want = matmul_ref(&arr(&r, "mm_x1"), &arr(&r, "mm_x2"), 4, 4, 4, false, false);
    assert_close(&arr(&r, "mm_y"), &want, 1e-5, "MatMul y aliasing x1");
    assert_eq!(int(&r, "hash_inplace_same"), 1);
}

#[test]
fn float16_operands_compute_through_f32() {
    let r = aclop(&["f16"]);
    let (x1, x2, y, z) = (arr(&r, "x1"), arr(&r, "x2"), arr(&r, "y"), arr(&r, "z"));
    // results are rounded to f16 (11-bit significand): relative error <= 2^-11
    let add: Vec<f64> = x1
        .iter()
        .zip(&x2)
        .map(|(a, b)| *a as f64 + *b as f64)
        .collect();
    assert_close(&y, &add, 1.0 / 2048.0, "f16 Add");
    assert_close(
        &z,
        &matmul_ref(&x1, &x2, 4, 4, 4, false, false),
        1.0 / 1024.0,
        "f16 MatMul",
    );
    // and they really are f16 values, not f32 ones
    let is_f16 =
        |v: f32| v == 0.0 || (v * 2f32.powi(10 - v.abs().log2().floor() as i32)).fract() == 0.0;
    assert!(y.iter().chain(&z).all(|v| is_f16(*v)), "{y:?} {z:?}");
    assert!(!is_f16(0.1f32), "the f16 check itself");
}

#[test]
fn host_placed_input_is_taken_at_launch() {
    let r = aclop(&["host"]);
    assert_eq!(arr(&r, "y"), vec![11.0, 22.0, 33.0, 44.0]);
}

#[test]
fn aclop_bad_input_gets_real_error_codes() {
    let r = aclop(&["errors"]);
    let expect: &[(&str, i64)] = &[
        ("null_optype", 100000),
        ("negative_inputs", 100000),
        ("negative_outputs", 100000),
        ("null_desc_array", 100000),
        ("null_buffer_array", 100000),
        ("null_buffer", 100000),
        ("null_data", 100000),
        ("small_buffer", 100000),
        ("matmul_one_input", 100021),
        ("matmul_no_output", 100022),
        ("matmul_bad_shape", 100000),
        ("add_double", 100026),
        ("unknown_typed", 100024),
        ("unknown_uint8_2d", 100024),
        ("destroy_buffer", 0),
        ("destroy_null_buffer", 100000),
        ("compile_bad_flag", 200001),
        ("compile_unregistered_no_path", 100000),
        ("attr_null", 100000),
        ("attr_null_name", 100000),
        ("reducesum_bad_axis", 100000),
        ("empty_outputs", 0),
        ("desc_dim_ok", 0),
        ("desc_dim1", 4),
        ("desc_dim_oob", 100000),
        ("desc_size", 64),
        ("desc_count", 16),
        ("desc_ndims", 2),
        ("dtsize_float", 4),
        ("dtsize_f16", 2),
        ("dtsize_bool", 1),
        ("dtsize_string", 0),
        ("dtsize_c128", 16),
        ("dtsize_999", 8),
        ("null_desc_create", 1),
    ];
    for (k, v) in expect {
        assert_eq!(int(&r, k), *v, "{k}");
    }
    // an invalid stream is refused with the runtime's code (not accepted, not a crash)
    assert_ne!(int(&r, "bad_stream"), 0);
    assert_eq!(r.fact("f16_bits").as_deref(), Some("3c00"));
    assert_eq!(r.fact("f16_half").as_deref(), Some("3800"));
    assert_eq!(r.fact("f16_max").as_deref(), Some("7bff"));
    assert_eq!(r.fact("f16_inf").as_deref(), Some("7c00"));
    let rt: f32 = r.fact("f16_roundtrip").unwrap().parse().unwrap();
    assert!((rt - 0.333333).abs() < 2e-4 && rt != 0.333333);
    // no queued work failed: nothing invalid reached a kernel
    assert_eq!(r.stat_u64(&["mmu_faults"]), 0);
    // each refusal is one line naming the operator, the element types and shapes
    for line in [
        "operator MyCustomOp refused (no simulated kernel for this operator): inputs float32[4,4], \
         float32[4,4]; outputs float32[4,4] -> 100024",
        "operator MyCustomOp refused (no simulated kernel for this operator): inputs uint8[8,8]; \
         outputs uint8[8,8] -> 100024",
        "operator Add refused (an input is float64; supported: float32, float16, bfloat16): inputs \
         float64[4,4], float64[4,4]; outputs float64[4,4] -> 100026",
    ] {
        assert_eq!(
            r.stderr.lines().filter(|l| l.ends_with(line)).count(),
            1,
            "no single line {line:?} in:\n{}",
            r.stderr
        );
    }
}

#[test]
fn validation_is_the_same_in_phantom_mode() {
    let real = aclop(&["errors"]);
    let phantom = run("optest_aclop", &["errors"], &[("ACLSIM_PHANTOM", "1")]).must_succeed();
    assert_eq!(phantom.stats["phantom"], serde_json::Value::Bool(true));
    for key in [
        "null_buffer",
        "small_buffer",
        "matmul_one_input",
        "matmul_bad_shape",
        "add_double",
        "bad_stream",
    ] {
        assert_eq!(real.fact(key), phantom.fact(key), "{key}");
    }
    // and an op is still timed and counted
    let r = run(
        "optest_aclop",
        &["flops", "2800000000000"],
        &[("ACLSIM_PHANTOM", "1")],
    )
    .must_succeed();
    assert_eq!(r.stat_u64(&["ops"]), 1);
    assert!(r.stat_u64(&["sim_ns"]) >= 10_000_000, "{}", r.stats);
}

#[test]
fn op_on_freed_buffer_is_an_mmu_fault() {
    let r = aclop(&["mmu"]);
    assert_eq!(
        int(&r, "launch_rc"),
        0,
        "the launch is asynchronous: the fault shows at sync"
    );
    assert_eq!(int(&r, "sync_rc"), 507053);
    assert_eq!(
        int(&r, "sync_again_rc"),
        0,
        "the stream error is reported once"
    );
    assert_eq!(int(&r, "after_rc"), 0);
    assert_eq!(r.fact("after_y63").as_deref(), Some("63"));
    assert_eq!(r.stat_u64(&["mmu_faults"]), 1);
    assert_eq!(r.stats["devices"][0]["mmu_faults"].as_u64(), Some(1));
    assert!(
        r.stderr.contains("aclopExecuteV2(Relu)"),
        "fault message names the op:\n{}",
        r.stderr
    );
}

#[test]
fn flops_attr_drives_simulated_time() {
    let none = aclop(&["flops", "-1"]).stat_u64(&["sim_ns"]);
    let zero = aclop(&["flops", "0"]).stat_u64(&["sim_ns"]);
    // 2.8e12 flops at the default 280 TFLOPS = 10 ms
    let big = aclop(&["flops", "2800000000000"]).stat_u64(&["sim_ns"]);
    assert_eq!(none, zero, "an unknown op has no flops of its own");
    assert!(none < 1_000_000, "small hash op took {none} ns");
    assert!(
        big >= 10_000_000 && big < 10_000_000 + 1_000_000,
        "flops=2.8e12 took {big} ns"
    );
    // the rate comes from ACLSIM_TFLOPS
    let slow = run(
        "optest_aclop",
        &["flops", "2800000000000"],
        &[("ACLSIM_TFLOPS", "28")],
    )
    .must_succeed()
    .stat_u64(&["sim_ns"]);
    assert!(
        slow >= 100_000_000 && slow < 101_000_000,
        "at 28 TFLOPS: {slow} ns"
    );
}

#[test]
fn injected_op_fault_fails_the_launch() {
    let r = run("optest_aclop", &["relu", "4"], &[("ACLSIM_FAULTS", "op:1")]);
    assert_eq!(
        r.code, 2,
        "ACL_CHECK exits 2 on the failed launch:\n{}",
        r.stderr
    );
    assert!(r.stderr.contains("507015"), "{}", r.stderr);
}

// ------------------------------------------------------------------ aclnn

#[test]
fn aclnn_add_with_alpha_and_broadcast() {
    let r = aclnn(&["add"]);
    let (a, b, y) = (arr(&r, "self"), arr(&r, "other"), arr(&r, "out"));
    let want: Vec<f64> = (0..12).map(|i| (a[i] + 2.5f32 * b[i % 4]) as f64).collect();
    assert_close(&y, &want, 1e-6, "aclnnAdd");
}

#[test]
fn aclnn_mul_broadcasts_both_operands() {
    let r = aclnn(&["mul"]);
    let (a, b, y) = (arr(&r, "self"), arr(&r, "other"), arr(&r, "out"));
    for i in 0..3 {
        for j in 0..4 {
            assert_eq!(y[i * 4 + j], a[i] * b[j]);
        }
    }
}

#[test]
fn aclnn_matmul_reads_a_transposed_view() {
    let (m, k, n) = (5usize, 6usize, 3usize);
    let r = aclnn(&["matmul_t", "5", "6", "3"]);
    // mat2 is the [K,N] transposed view of an [N,K] buffer: exactly the tb case
    let want = matmul_ref(
        &arr(&r, "self"),
        &arr(&r, "mat2_storage"),
        m,
        k,
        n,
        false,
        true,
    );
    assert_close(&arr(&r, "out"), &want, 1e-5, "aclnnMatmul transposed mat2");
    assert_eq!(r.fact("view_shape").as_deref(), Some("2:6,3"));
}

#[test]
fn aclnn_batched_matmul_with_offset_view() {
    let (b, m, k, n) = (2usize, 3usize, 4usize, 5usize);
    let r = aclnn(&["bmm", "2", "3", "4", "5"]);
    let (x1, x2) = (arr(&r, "self"), arr(&r, "mat2"));
    let mut want = Vec::new();
    for i in 0..b {
        want.extend(matmul_ref(
            &x1[i * m * k..(i + 1) * m * k],
            &x2[i * k * n..(i + 1) * k * n],
            m,
            k,
            n,
            false,
            false,
        ));
    }
    assert_close(&arr(&r, "out"), &want, 1e-5, "aclnnMatmul batched");
}

#[test]
fn aclnn_softmax_along_either_dim() {
    let (rows, cols) = (3usize, 7usize);
    for dim in ["0", "-1", "1"] {
        let r = aclnn(&["softmax", "3", "7", dim]);
        let (x, y) = (arr(&r, "x"), arr(&r, "y"));
        let along_rows = dim == "0";
        let (outer, len) = if along_rows {
            (cols, rows)
        } else {
            (rows, cols)
        };
        for o in 0..outer {
            let idx = |i: usize| {
                if along_rows {
                    i * cols + o
                } else {
                    o * cols + i
                }
            };
            let e: Vec<f64> = (0..len).map(|i| (x[idx(i)] as f64).exp()).collect();
            let s: f64 = e.iter().sum();
            let got: Vec<f32> = (0..len).map(|i| y[idx(i)]).collect();
            let want: Vec<f64> = e.iter().map(|v| v / s).collect();
            assert_close(&got, &want, 1e-5, &format!("aclnnSoftmax dim={dim}"));
        }
    }
}

#[test]
fn aclnn_in_place_add() {
    // out, self and other are one tensor: x + (-3) * x
    let r = aclnn(&["inplace"]);
    assert_eq!(arr(&r, "out"), vec![-2.0, -4.0, -6.0, -8.0, -10.0]);
}

#[test]
fn aclnn_bad_input_and_executor_misuse() {
    let r = aclnn(&["errors"]);
    let expect: &[(&str, i64)] = &[
        ("null_self", 161001),
        ("null_alpha", 161001),
        ("null_data", 161001),
        ("null_data_out", 161001),
        ("null_executor_out", 161001),
        ("shape_mismatch", 161002),
        ("matmul_mismatch", 161002),
        ("matmul_bad_cube", 161002),
        ("softmax_bad_dim", 161002),
        ("view_out_of_storage", 161002),
        ("launch_null", 161002),
        ("launch_unknown", 161002),
        ("prepare_ok", 0),
        ("workspace", 0),
        ("launch_ok", 0),
        ("launch_reused", 161002),
        ("destroy_executor", 0),
        ("launch_destroyed", 161002),
        ("destroy_executor_null", 561103),
        ("destroy_tensor", 0),
        ("destroy_tensor_again", 161002),
        ("use_destroyed", 161002),
        ("destroy_null", 0),
        ("destroy_wrong_kind", 161002),
        ("viewshape_null", 161001),
        ("viewshape_destroyed", 161002),
        ("create_null_dims", 1),
        ("create_null_scalar", 1),
        ("destroy_intarray", 0),
        ("destroy_list", 0),
        ("list_owned_tensor", 161002),
    ];
    for (k, v) in expect {
        assert_eq!(int(&r, k), *v, "{k}");
    }
    // only the one valid launch ran
    assert_eq!(r.stat_u64(&["ops"]), 1);
}

#[test]
fn aclnn_injected_op_fault() {
    let r = run("optest_aclnn", &["fault"], &[("ACLSIM_FAULTS", "op:1")]).must_succeed();
    assert_eq!(int(&r, "first_launch"), 507015);
    assert_eq!(int(&r, "second_launch"), 0);
    // only the second x*x ran
    assert_eq!(arr(&r, "out"), vec![1.0, 4.0, 9.0, 16.0]);
    assert_eq!(r.stat_u64(&["injected_faults"]), 1);
    let clean = aclnn(&["fault"]);
    assert_eq!(arr(&clean, "out"), vec![1.0, 16.0, 81.0, 256.0]);
}

// ------------------------------------------- LLM operators without torch
// tests/apps/optest_llm.c: the entry points torch_npu 2.14 reaches only in
// compatibility modes, FlashAttentionScore called directly, and refusals.

fn llm(args: &[&str]) -> Run {
    run("optest_llm", args, &[]).must_succeed()
}

/// erf by its Taylor series (|x| < 4 here): exact to double rounding.
fn erf(x: f64) -> f64 {
    let (mut term, mut sum, x2) = (x, x, x * x);
    for n in 1..200 {
        term *= -x2 / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn gelu_v2_both_approximations_and_their_gradients() {
    let r = llm(&["gelu"]);
    let (x, dy) = (arr(&r, "x"), arr(&r, "dy"));
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let mut want = [vec![], vec![], vec![], vec![]];
    for (xi, gi) in x.iter().zip(&dy) {
        let (v, g) = (*xi as f64, *gi as f64);
        let inner = c * (v + 0.044715 * v * v * v);
        let th = inner.tanh();
        want[0].push(0.5 * v * (1.0 + erf(v / 2f64.sqrt())));
        want[1].push(0.5 * v * (1.0 + th));
        let pdf = (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt();
        want[2].push(g * (0.5 * (1.0 + erf(v / 2f64.sqrt())) + v * pdf));
        want[3].push(
            g * (0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * v * v)),
        );
    }
    for (key, w) in ["gelu_none", "gelu_tanh", "grad_none", "grad_tanh"]
        .iter()
        .zip(&want)
    {
        assert_close(&arr(&r, key), w, 1e-6, key);
    }
    // the two forms differ: the tanh form is really computed
    assert!(arr(&r, "gelu_none") != arr(&r, "gelu_tanh"));
    assert_eq!(int(&r, "approximate_2"), 161002);
    assert_eq!(int(&r, "approximate_bad"), 161002);
}

#[test]
fn foreach_v1_operators_with_a_device_scalar() {
    let r = llm(&["foreach_v1"]);
    let (x1, x2, x3) = (arr(&r, "x1"), arr(&r, "x2"), arr(&r, "x3"));
    let s = 0.75f64;
    let f = |op: &dyn Fn(f64, f64, f64) -> f64| -> Vec<f64> {
        (0..8)
            .map(|i| op(x1[i] as f64, x2[i] as f64, x3[i] as f64))
            .collect()
    };
    let cases: [(&str, Vec<f64>); 7] = [
        ("add_scalar", f(&|a, _, _| a + s)),
        ("sub_scalar", f(&|a, _, _| a - s)),
        ("mul_scalar", f(&|a, _, _| a * s)),
        ("div_scalar", f(&|a, _, _| a / s)),
        ("add_list", f(&|a, b, _| a + s * b)),
        ("addcdiv_scalar", f(&|a, b, c| a + s * b / c)),
        ("addcmul_scalar", f(&|a, b, c| a + s * b * c)),
    ];
    for (key, want) in &cases {
        assert_close(&arr(&r, key), want, 1e-6, key);
    }
}

#[test]
fn flash_attention_score_direct_gqa_right_down_causal() {
    let r = llm(&["attention"]);
    let (q, k, v) = (arr(&r, "q"), arr(&r, "k"), arr(&r, "v"));
    let (n1, n2, s1, s2, d) = (4usize, 2usize, 3usize, 5usize, 4usize);
    let (mut out, mut mx, mut sm) = (vec![], vec![], vec![]);
    for n in 0..n1 {
        let nk = n / (n1 / n2);
        for i in 0..s1 {
            // sparse mode 3: causal from the bottom right, j <= i + (S2 - S1)
            let allowed: Vec<usize> = (0..s2).filter(|&j| j <= i + (s2 - s1)).collect();
            let score: Vec<f64> = allowed
                .iter()
                .map(|&j| {
                    0.5 * (0..d)
                        .map(|e| q[(n * s1 + i) * d + e] as f64 * k[(nk * s2 + j) * d + e] as f64)
                        .sum::<f64>()
                })
                .collect();
            let m = score.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = score.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = p.iter().sum();
            for e in 0..d {
                out.push(
                    allowed
                        .iter()
                        .zip(&p)
                        .map(|(&j, pj)| pj * v[(nk * s2 + j) * d + e] as f64)
                        .sum::<f64>()
                        / sum,
                );
            }
            mx.extend(std::iter::repeat(m).take(8));
            sm.extend(std::iter::repeat(sum).take(8));
        }
    }
    assert_close(&arr(&r, "out"), &out, 1e-6, "attention out");
    assert_close(&arr(&r, "softmax_max"), &mx, 1e-6, "softmax max");
    assert_close(&arr(&r, "softmax_sum"), &sm, 1e-6, "softmax sum");
    for key in [
        "keep_prob",
        "layout_tnd",
        "pse",
        "sparse_prefix",
        "heads_not_multiple",
    ] {
        assert_eq!(int(&r, key), 161002, "{key}");
    }
}

#[test]
fn aclnn_refuses_an_element_type_with_one_line() {
    let r = llm(&["refusals"]);
    assert_eq!(int(&r, "silu_int32"), 161002);
    let lines: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| {
            l.contains("operator Silu refused")
                && l.contains("inputs int32[2,3]; outputs int32[2,3]")
        })
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
}
