//! Ops on tensors whose batch a reshape merged with another axis or a transpose
//! moved: they compute on the tensor aligned to the view where they leave the
//! batch's axis alone (`Pad`, `Flatten`, `Expand`, `Concat`, the reductions), as
//! timm's BoTNet (relative logits over `[B·heads·H, W, 2W-1]`) and CrossViT
//! (branch logits stacked before the batch) export them, and refuse by node where
//! they would touch it.

use batchfit_graph::{Graph, Op, ReduceKind, onnx};

mod common;
use common::*;

fn ops(g: &Graph, name: &str) -> Vec<Op> {
    g.nodes
        .iter()
        .filter(|n| n.op.name() == name)
        .map(|n| n.op.clone())
        .collect()
}

/// BoTNet's shift from relative to absolute positions: `F.pad(x, [0, 1])` of the
/// batch merged with the heads, `flatten(1)`, a second pad, a reshape and a slice,
/// then the batch split out again.
#[test]
fn relative_logits_pad_and_flatten_a_merged_batch() {
    let (h, w) = (2i64, 3i64);
    let rel = 2 * w - 1;
    let mut n = Net::new("rel-logits");
    n.input("x", &format!("batch,{h},{w},{rel}"));
    n.init(int64s("merged", &[-1, w, rel]))
        .init(int64s("pad1", &[0, 0, 0, 0, 0, 1]))
        .init(int64s("pad2", &[0, 0, 0, rel - w]))
        .init(int64s("rows", &[-1, w + 1, rel]))
        .init(int64s("row_start", &[0]))
        .init(int64s("row_end", &[w]))
        .init(int64s("col_start", &[w - 1]))
        .init(int64s("col_end", &[rel]))
        .init(int64s("axis1", &[1]))
        .init(int64s("axis2", &[2]))
        .init(int64s("split", &[-1, h, w, w]));
    n.node("Reshape", "m", &["x", "merged"], &["xm"], vec![]);
    n.node("Pad", "p1", &["xm", "pad1"], &["xp"], vec![]);
    n.node("Flatten", "f", &["xp"], &["xf"], vec![int("axis", 1)]);
    n.node("Pad", "p2", &["xf", "pad2"], &["xq"], vec![]);
    n.node("Reshape", "r", &["xq", "rows"], &["xr"], vec![]);
    n.node(
        "Slice",
        "rows_kept",
        &["xr", "row_start", "row_end", "axis1"],
        &["xk"],
        vec![],
    );
    n.node(
        "Slice",
        "cols_kept",
        &["xk", "col_start", "col_end", "axis2"],
        &["xs"],
        vec![],
    );
    n.node("Reshape", "back", &["xs", "split"], &["y"], vec![]);
    n.output("y");
    let g = onnx::parse(&n.bytes()).unwrap();
    // The first pad acts on the last axis of the aligned [B, heads, W, 2W-1].
    let pads: Vec<Vec<[usize; 2]>> = ops(&g, "pad")
        .into_iter()
        .map(|op| match op {
            Op::Pad { pads, .. } => pads,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(pads[0], vec![[0, 0], [0, 0], [0, 1]]);
    assert_eq!(pads[1], vec![[0, 0], [0, (rel - w) as usize]]);
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        "[B, 2, 3, 3]"
    );
}

/// A merged view padded on its merged axis, or flattened into the batch, names
/// the node.
#[test]
fn a_pad_of_the_merged_axis_is_refused_by_node() {
    let mut n = Net::new("pad-batch");
    n.input("x", "batch,2,3,5");
    n.init(int64s("merged", &[-1, 3, 5]))
        .init(int64s("pads", &[1, 0, 0, 0, 0, 0]));
    n.node("Reshape", "m", &["x", "merged"], &["xm"], vec![]);
    n.node("Pad", "pad_batch", &["xm", "pads"], &["y"], vec![]);
    n.output("y");
    let e = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(e.contains("pad_batch"), "{e}");
}

/// `x.reshape(B, H, 1, W, k).expand(-1, -1, k, -1, -1)` read by a transpose (not a
/// broadcasting op): the repeated values are an IR `Expand`; of a merged view too.
#[test]
fn expand_of_an_activation_repeats_its_axes_of_size_one() {
    let mut n = Net::new("expand");
    n.input("x", "batch,3,1,4");
    n.init(int64s("shape", &[1, 1, 5, 1]));
    n.node("Expand", "e", &["x", "shape"], &["xe"], vec![]);
    n.node(
        "Transpose",
        "t",
        &["xe"],
        &["y"],
        vec![ints("perm", &[0, 2, 1, 3])],
    );
    n.output("y");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        ops(&g, "expand"),
        vec![Op::Expand {
            shape: vec![1, 5, 1]
        }]
    );
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        "[B, 5, 3, 4]"
    );

    // The batch merged with the first axis: the target names the view's axes.
    let mut n = Net::new("expand-merged");
    n.input("x", "batch,2,3,1,4");
    n.init(int64s("merged", &[-1, 3, 1, 4]))
        .init(int64s("shape", &[1, 1, 5, 1]))
        .init(int64s("split", &[-1, 2, 3, 5, 4]));
    n.node("Reshape", "m", &["x", "merged"], &["xm"], vec![]);
    n.node("Expand", "e", &["xm", "shape"], &["xe"], vec![]);
    n.node("Reshape", "back", &["xe", "split"], &["y"], vec![]);
    n.output("y");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        ops(&g, "expand"),
        vec![Op::Expand {
            shape: vec![1, 1, 5, 1]
        }]
    );
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        "[B, 2, 3, 5, 4]"
    );

    // Repeating the batch's axis is refused by node.
    let mut n = Net::new("expand-batch");
    n.input("x", "batch,3,1,4");
    n.init(int64s("shape", &[2, 3, 5, 4]));
    n.node("Expand", "repeat_batch", &["x", "shape"], &["xe"], vec![]);
    n.node("Relu", "r", &["xe"], &["y"], vec![]);
    n.output("y");
    let e = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(e.contains("repeat_batch"), "{e}");
}

/// CrossViT: each branch's logits unsqueezed before the batch, stacked along that
/// axis and averaged over it.
#[test]
fn branch_logits_stacked_before_the_batch_and_averaged() {
    let (f, c) = (8i64, 10i64);
    let mut n = Net::new("stacked-heads");
    n.input("x", &format!("batch,{f}"));
    n.init(int64s("lead", &[0]));
    for head in ["a", "b"] {
        n.weight(&format!("{head}.weight"), &[c, f])
            .weight(&format!("{head}.bias"), &[c]);
        n.node(
            "Gemm",
            head,
            &["x", &format!("{head}.weight"), &format!("{head}.bias")],
            &[&format!("{head}_out")],
            vec![int("transB", 1)],
        );
        n.node(
            "Unsqueeze",
            &format!("{head}_u"),
            &[&format!("{head}_out"), "lead"],
            &[&format!("{head}_stacked")],
            vec![],
        );
    }
    n.node(
        "Concat",
        "stack",
        &["a_stacked", "b_stacked"],
        &["both"],
        vec![int("axis", 0)],
    );
    n.node(
        "ReduceMean",
        "mean",
        &["both", "lead"],
        &["y"],
        vec![int("keepdims", 0)],
    );
    n.output("y");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.param_count(), 2 * (c * f + c) as u64);
    assert_eq!(ops(&g, "concat"), vec![Op::Concat { axis: 1 }]);
    // ONNX axis 0 of [2, B, 10] is axis 1 of the aligned [B, 2, 10].
    assert_eq!(
        ops(&g, "reduce_mean"),
        vec![Op::Reduce {
            reduce: ReduceKind::Mean,
            axes: vec![1],
            keep_dims: false,
        }]
    );
    assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 10]");

    // Stacked along the batch's own axis: refused by node.
    let mut n2 = n.clone();
    n2.g.node.retain(|x| x.name != "stack" && x.name != "mean");
    n2.node(
        "Concat",
        "along_batch",
        &["a_stacked", "b_stacked"],
        &["y"],
        vec![int("axis", 1)],
    );
    let e = onnx::parse(&n2.bytes()).unwrap_err().to_string();
    assert!(e.contains("along_batch"), "{e}");
}

/// One sample through the IR's layout ops (reshapes and sample-axis transposes),
/// as row-major values: what the graph computes, without an engine.
fn run_layout(g: &Graph, input: &[f32]) -> Vec<f32> {
    let mut vals: std::collections::HashMap<String, (Vec<usize>, Vec<f32>)> =
        std::collections::HashMap::new();
    let dims = |s: &batchfit_graph::Shape| s.all_fixed().expect("fixed sample");
    let x = &g.inputs[0];
    vals.insert(x.name.clone(), (dims(&x.shape), input.to_vec()));
    for node in &g.nodes {
        let (in_dims, v) = vals[&node.inputs[0]].clone();
        let out = match &node.op {
            Op::Transpose { perm } => {
                let out_dims: Vec<usize> = perm.iter().map(|&p| in_dims[p]).collect();
                let strides: Vec<usize> = (0..in_dims.len())
                    .map(|k| in_dims[k + 1..].iter().product())
                    .collect();
                (0..v.len())
                    .map(|mut flat| {
                        let mut src = 0;
                        for k in (0..out_dims.len()).rev() {
                            src += (flat % out_dims[k]) * strides[perm[k]];
                            flat /= out_dims[k];
                        }
                        v[src]
                    })
                    .collect()
            }
            Op::Reshape { .. } | Op::Flatten | Op::Relu => v,
            // A stand-in recurrent layer that outputs each step's input: the layouts
            // around a real one must then give the input back.
            Op::Rnn {
                input_size,
                hidden,
                bidirectional: false,
                ..
            } if input_size == hidden => v,
            op => panic!("not a layout op: {op:?}"),
        };
        vals.insert(node.name.clone(), (dims(&node.shape), out));
    }
    vals[&g.loss.input].1.clone()
}

/// A reshape that splits an axis whose atoms are in another order than the split
/// wants (MaxViT's grid partition after a window partition): ONNX reshapes the
/// logical order, so the view is aligned first and the values land where ONNX
/// puts them.
#[test]
fn a_reshape_across_permuted_atoms_aligns_the_view_first() {
    let mut n = Net::new("repartition");
    n.input("x", "batch,2,3");
    n.init(int64s("merged", &[-1, 6]))
        .init(int64s("split", &[-1, 2, 3]));
    n.node(
        "Transpose",
        "t",
        &["x"],
        &["xt"],
        vec![ints("perm", &[0, 2, 1])],
    );
    n.node("Reshape", "m", &["xt", "merged"], &["xm"], vec![]);
    n.node("Reshape", "s", &["xm", "split"], &["xs"], vec![]);
    n.node("Relu", "r", &["xs"], &["y"], vec![]);
    n.output("y");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.shape_of(&g.loss.input).unwrap().to_string(), "[B, 2, 3]");
    // x = [[0, 1, 2], [3, 4, 5]]; transposed and read row-major: 0 3 1 4 2 5.
    let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
    assert_eq!(run_layout(&g, &x), vec![0., 3., 1., 4., 2., 5.]);
}

/// timm's Sequencer runs an LSTM over a batch merged with the rows, `[B·R, T, F]`
/// (`x.reshape(-1, T, C)`), which ONNX reads time-major: each sample's R sequences
/// run in one IR recurrent layer over `[R, T, F]`, and its output is seen back through
/// the merged layout. With a stand-in layer that returns its input, the layouts around
/// it give the input back in ONNX's order.
#[test]
fn a_recurrent_layer_over_a_batch_merged_with_rows() {
    let (r, t, f) = (2i64, 3i64, 4i64);
    let mut n = Net::new("sequencer");
    n.input("x", &format!("batch,{r},{t},{f}"));
    n.init(int64s("merged", &[-1, t, f]))
        .init(int64s("dirs_axis", &[1]))
        .init(int64s("split", &[-1, r, t, f]));
    n.weight("W", &[1, 4 * f, f])
        .weight("R", &[1, 4 * f, f])
        .weight("B", &[1, 8 * f]);
    n.node("Reshape", "m", &["x", "merged"], &["xm"], vec![]);
    n.node(
        "Transpose",
        "tm",
        &["xm"],
        &["xt"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.node(
        "LSTM",
        "lstm",
        &["xt", "W", "R", "B"],
        &["y"],
        vec![int("hidden_size", f)],
    );
    n.node("Squeeze", "sq", &["y", "dirs_axis"], &["ys"], vec![]);
    n.node(
        "Transpose",
        "bf",
        &["ys"],
        &["yb"],
        vec![ints("perm", &[1, 0, 2])],
    );
    n.node("Reshape", "s", &["yb", "split"], &["yr"], vec![]);
    n.node("Relu", "act", &["yr"], &["out"], vec![]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    let lstm = g.nodes.iter().find(|x| x.op.name() == "lstm").unwrap();
    assert_eq!(lstm.shape.to_string(), format!("[B, {r}, {t}, {f}]"));
    assert_eq!(g.param_count(), (2 * 4 * f * f + 8 * f) as u64);
    assert_eq!(
        g.shape_of(&g.loss.input).unwrap().to_string(),
        format!("[B, {r}, {t}, {f}]")
    );
    let x: Vec<f32> = (0..r * t * f).map(|v| v as f32).collect();
    assert_eq!(run_layout(&g, &x), x);
}
