//! ONNX files the importer rejects, and loading through the crate's entry
//! point: every error names the file, node or value at fault.

use batchfit_graph::onnx::proto::GraphProto;
use batchfit_graph::{GraphError, Op, PoolKind, onnx};

mod common;
use common::*;

#[test]
fn garbage_and_truncated_files_name_the_path() {
    let dir = temp_dir("garbage");
    let bytes = seed2().bytes();
    let cases = [
        ("truncated.onnx", bytes[..bytes.len() / 2].to_vec()),
        ("text.onnx", b"this is not an onnx model\n".to_vec()),
        ("empty-graph.onnx", model_bytes(GraphProto::default(), 17)),
    ];
    for (file, content) in cases {
        let path = dir.join(file);
        std::fs::write(&path, content).unwrap();
        let err = onnx::load(&path).unwrap_err();
        let shown = path.display().to_string();
        assert!(
            matches!(&err, GraphError::InFile { path: p, .. } if *p == path),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&shown) && msg.contains("not a valid ONNX model"),
            "{file}: {msg}"
        );
    }
    let missing = dir.join("missing.onnx");
    let msg = batchfit_graph::load(missing.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("missing.onnx") && msg.contains("cannot read"),
        "{msg}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn unknown_op_names_node_and_type() {
    let mut n = Net::new("detector");
    n.input("boxes", "batch,100,4")
        .input("scores", "batch,1,100");
    n.node(
        "NonMaxSuppression",
        "nms",
        &["boxes", "scores"],
        &["selected"],
        vec![],
    );
    n.output("selected");
    let err = onnx::parse(&n.bytes()).unwrap_err();
    match &err {
        GraphError::Unsupported { node, op_type, .. } => {
            assert_eq!(node, "nms");
            assert_eq!(op_type, "NonMaxSuppression");
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("`nms`") && msg.contains("NonMaxSuppression") && msg.contains("Gemm"),
        "{msg}"
    );
}

#[test]
fn unfoldable_constants_and_batch_reshapes_are_errors() {
    // x + 2: a constant added (an epsilon before a division), untrained.
    let mut n = Net::new("scale");
    n.input("x", "batch,8");
    n.init(scalar("two", 2.0));
    n.node("Add", "scale", &["x", "two"], &["y"], vec![]);
    n.weight("W", &[1, 8]);
    n.node("Gemm", "fc", &["y", "W"], &["out"], vec![int("transB", 1)]);
    n.output("out");
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(
        g.nodes[0].op,
        Op::AddConst {
            shape: vec![],
            values: vec![2.0]
        }
    );
    assert_eq!(g.param_count(), 8);

    // A constant that would enlarge the sample (a new leading axis of 3) is refused,
    // naming the node.
    let mut wide = n.clone();
    wide.g.initializer[0] = floats("two", &[3, 8], &[2.0; 24]);
    let msg = onnx::parse(&wide.bytes()).unwrap_err().to_string();
    assert!(
        msg.contains("node `scale`") && msg.contains("constant"),
        "{msg}"
    );

    // Adding zeros is an alias.
    n.g.initializer[0] = scalar("two", 0.0);
    let g = onnx::parse(&n.bytes()).unwrap();
    assert_eq!(g.nodes.len(), 1);

    // Reshape that folds the time axis into the batch.
    let mut n = Net::new("fold");
    n.input("x", "batch,4,8");
    n.init(int64s("s", &[32, 8]));
    n.node("Reshape", "fold", &["x", "s"], &["y"], vec![]);
    n.node("Relu", "act", &["y"], &["out"], vec![]);
    n.output("out");
    let msg = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        msg.contains("node `fold`") && msg.contains("batch"),
        "{msg}"
    );

    // Clip to an empty range.
    let mut n = Net::new("clip");
    n.input("x", "batch,8");
    n.init(scalar("lo", 1.0)).init(scalar("hi", -1.0));
    n.node("Clip", "hardtanh", &["x", "lo", "hi"], &["out"], vec![]);
    n.output("out");
    let msg = onnx::parse(&n.bytes()).unwrap_err().to_string();
    assert!(
        msg.contains("node `hardtanh`") && msg.contains("empty range"),
        "{msg}"
    );
}

#[test]
fn onnx_file_loads_through_the_crate_entry_point() {
    let dir = temp_dir("load");
    let path = dir.join("seed2.onnx");
    let mut net = seed2();
    net.g.name = "main_graph".into(); // PyTorch's default: the file name is used instead
    std::fs::write(&path, net.bytes()).unwrap();
    let g = batchfit_graph::load(path.to_str().unwrap()).unwrap();
    assert_eq!(g.param_count(), 87_229);
    assert_eq!(g.name, "seed2");
    assert_eq!(g.output().shape.to_string(), "[B, 1]");
    assert!(matches!(
        g.nodes[2].op,
        Op::Pool {
            pool: PoolKind::Avg,
            ..
        }
    ));
    std::fs::remove_dir_all(dir).unwrap();
}
