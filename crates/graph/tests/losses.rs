//! The loss a user names, read by the output's layout: per-position
//! cross-entropy for `[B, C, d1, ...]`, CTC for `[B, T, C]` and `[B, C, T]`,
//! MSE keeping a final softmax; refusals name the output.

mod common;

use batchfit_graph::{Graph, LossChoice, LossKind, LossRequest, Op, onnx, spec};
use common::*;

/// A 1x1 convolution from 3 channels to `classes` over `spatial` (an image's
/// `[H, W]`, a sequence's `[T]`), with `loss` as the TOML `[loss]` table's body.
fn conv_head(spatial: &[usize], classes: usize, loss: &str) -> Result<Graph, String> {
    let dims: Vec<String> = spatial.iter().map(usize::to_string).collect();
    let op = if spatial.len() == 1 {
        "conv1d"
    } else {
        "conv2d"
    };
    let text = format!(
        r#"
        name = "head"
        [[input]]
        name = "x"
        shape = [3, {}]
        [[layer]]
        name = "logits"
        op = "{op}"
        out_channels = {classes}
        kernel = 1
        [loss]
        {loss}
        "#,
        dims.join(", ")
    );
    spec::parse(&text).map_err(|e| e.to_string())
}

fn output(g: &Graph) -> String {
    g.shape_of(&g.loss.input).unwrap().to_string()
}

fn ops(g: &Graph) -> Vec<&'static str> {
    g.nodes.iter().map(|n| n.op.name()).collect()
}

#[test]
fn segmentation_logits_get_a_cross_entropy_per_pixel() {
    // [B, 5, 4, 6]: five classes first (PyTorch's CrossEntropyLoss layout), 24 pixels.
    let g = conv_head(&[4, 6], 5, r#"kind = "cross_entropy""#).unwrap();
    assert_eq!(g.loss.kind, LossKind::CrossEntropyPerFrame);
    assert_eq!(output(&g), "[B, 24, 5]");
    assert_eq!(ops(&g), ["conv2d", "transpose", "reshape"]);
    assert_eq!(
        g.nodes[1].op,
        Op::Transpose {
            perm: vec![1, 2, 0]
        }
    );
    // The loss adds no parameter.
    assert_eq!(g.param_count(), 5 * 3 + 5);
}

#[test]
fn a_named_class_axis_is_read_where_it_is() {
    // The last axis (6) as the classes: no transpose, the 5 x 4 positions as rows.
    let g = conv_head(
        &[4, 6],
        5,
        r#"kind = "cross_entropy"
        class_axis = -1"#,
    )
    .unwrap();
    assert_eq!(output(&g), "[B, 20, 6]");
    assert_eq!(ops(&g), ["conv2d", "reshape"]);

    // The middle axis, counted as PyTorch counts dims (the batch is 0).
    let g = conv_head(
        &[4, 6],
        5,
        r#"kind = "cross_entropy"
        class_axis = 2"#,
    )
    .unwrap();
    assert_eq!(output(&g), "[B, 30, 4]");
}

#[test]
fn ctc_reads_class_first_sequences_through_a_transpose() {
    // Wav2Letter's raw [B, C, T]: the classes named at axis 1.
    let g = conv_head(
        &[50],
        29,
        r#"kind = "ctc"
        class_axis = 1
        blank = 28"#,
    )
    .unwrap();
    assert_eq!(g.loss.kind, LossKind::Ctc { blank: 28 });
    assert_eq!(output(&g), "[B, 50, 29]");
    assert_eq!(ops(&g), ["conv1d", "transpose"]);
}

#[test]
fn two_axes_read_as_a_sequence_with_its_classes_last_by_default() {
    // [B, 29, 50] read by rank as [B, T, C]: 50 classes last, no node added.
    let g = conv_head(&[50], 29, r#"kind = "cross_entropy""#).unwrap();
    assert_eq!(g.loss.kind, LossKind::CrossEntropyPerFrame);
    assert_eq!(output(&g), "[B, 29, 50]");
    assert_eq!(ops(&g), ["conv1d"]);
    assert_eq!(g.classes(), Some(50));
    // The same output for CTC: blank 0 unless named.
    let g = g.with_loss(&LossRequest::new(LossChoice::Ctc)).unwrap();
    assert_eq!(g.loss.kind, LossKind::Ctc { blank: 0 });
    assert_eq!(ops(&g), ["conv1d"]);
}

#[test]
fn outputs_a_loss_cannot_read_are_refused_by_name() {
    let refused = |spatial: &[usize], classes, loss: &str, says: &str| {
        let err = conv_head(spatial, classes, loss).unwrap_err();
        assert!(err.contains("`logits`") && err.contains(says), "{err}");
    };
    // The batch is not a class axis, nor is an axis past the output's.
    refused(
        &[4, 6],
        5,
        "kind = \"cross_entropy\"\nclass_axis = 0",
        "the batch is axis 0",
    );
    refused(
        &[4, 6],
        5,
        "kind = \"cross_entropy\"\nclass_axis = 4",
        "--class-axis 4",
    );
    refused(&[4, 6], 5, "kind = \"ctc\"", "[B, T, C] or [B, C, T]");
    refused(&[50], 29, "kind = \"ctc\"\nblank = 50", "blank 50");
    // One class is no classification.
    refused(&[4, 6], 1, "kind = \"cross_entropy\"", "above 1");
}

/// A convolution to `[B, 3, 7]` and a final softmax over `axis`.
fn softmax_head(axis: i64) -> Vec<u8> {
    let mut n = Net::new("softmax-head");
    n.input("x", "batch,4,7");
    n.weight("conv.W", &[3, 4, 1]).weight("conv.B", &[3]);
    n.node(
        "Conv",
        "/Conv",
        &["x", "conv.W", "conv.B"],
        &["c"],
        vec![ints("kernel_shape", &[1])],
    );
    n.node(
        "Softmax",
        "/Softmax",
        &["c"],
        &["y"],
        vec![int("axis", axis)],
    );
    n.output("y");
    n.bytes()
}

#[test]
fn mse_keeps_a_final_softmax_and_cross_entropy_drops_it() {
    let bytes = softmax_head(-1);
    let mse = onnx::parse_with_loss(
        &bytes,
        Some(LossRequest::new(LossChoice::Mse).import_hint()),
    )
    .unwrap()
    .with_loss(&LossRequest::new(LossChoice::Mse))
    .unwrap();
    assert_eq!(mse.loss.kind, LossKind::Mse);
    assert_eq!(ops(&mse), ["conv1d", "softmax"]);

    // A final softmax over the class axis already arranged the output: a
    // requested cross-entropy or CTC reads it as it is.
    for (choice, kind) in [
        (LossChoice::CrossEntropy, LossKind::CrossEntropyPerFrame),
        (LossChoice::Ctc, LossKind::Ctc { blank: 0 }),
    ] {
        let req = LossRequest::new(choice);
        let g = onnx::parse_with_loss(&softmax_head(1), Some(req.import_hint()))
            .unwrap()
            .with_loss(&req)
            .unwrap();
        assert_eq!(g.loss.kind, kind);
        assert_eq!(output(&g), "[B, 7, 3]");
        assert_eq!(ops(&g), ["conv1d", "transpose"]);
    }
}

#[test]
fn raw_onnx_logits_take_the_loss_asked_for() {
    // No final softmax: [B, 3, 7] reads by its shape as 7 classes at each of 3
    // positions; asked, as 3 classes (axis 1) at each of 7.
    let mut n = Net::new("raw-head");
    n.input("x", "batch,4,7");
    n.weight("conv.W", &[3, 4, 1]).weight("conv.B", &[3]);
    n.node(
        "Conv",
        "/Conv",
        &["x", "conv.W", "conv.B"],
        &["y"],
        vec![ints("kernel_shape", &[1])],
    );
    n.output("y");
    let dir = temp_dir("raw-head");
    let path = dir.join("raw-head.onnx");
    std::fs::write(&path, n.bytes()).unwrap();
    let source = path.to_str().unwrap();

    let g = batchfit_graph::load(source).unwrap();
    assert_eq!(g.loss.kind, LossKind::CrossEntropyPerFrame);
    assert_eq!(output(&g), "[B, 3, 7]");
    let req = LossRequest {
        class_axis: Some(1),
        ..LossRequest::new(LossChoice::CrossEntropy)
    };
    let g = batchfit_graph::load_with_loss(source, Some(&req)).unwrap();
    assert_eq!(g.loss.kind, LossKind::CrossEntropyPerFrame);
    assert_eq!(output(&g), "[B, 7, 3]");
    // A refusal names the file and the node whose output the loss reads.
    let req = LossRequest {
        class_axis: Some(3),
        ..req
    };
    let err = batchfit_graph::load_with_loss(source, Some(&req))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("raw-head.onnx") && err.contains("`/Conv`"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
