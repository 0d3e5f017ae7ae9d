//! How long the static plan takes for a deep model (target: well under a second
//! for 100 layers). Run with `cargo bench -p batchfit-plan`.

use batchfit_graph::{GraphBuilder, LossKind, Op, Shape};
use batchfit_plan::{Bytes, TrainOptions, plan};
use std::time::Instant;

fn main() {
    for layers in [100usize, 1000] {
        let mut g = GraphBuilder::new("deep");
        g.input("x", Shape::fixed(&[3, 32, 32])).unwrap();
        g.conv("conv0", "x", 16, 2, 3, 1, None).unwrap();
        let mut last = "conv0".to_string();
        for i in 0..layers / 2 {
            let c = format!("conv{}", i + 1);
            g.conv(&c, &last, 16, 2, 3, 1, None).unwrap();
            let r = format!("relu{}", i + 1);
            g.push(&r, Op::Relu, &[&c]).unwrap();
            last = r;
        }
        g.push("flat", Op::Flatten, &[&last]).unwrap();
        g.linear("out", "flat", 10).unwrap();
        let graph = g.finish(LossKind::CrossEntropy, "out").unwrap();
        let runs = 20;
        let t0 = Instant::now();
        let mut max_batch = 0;
        for _ in 0..runs {
            let p = plan(&graph, &TrainOptions::default());
            max_batch = p.max_batch(Bytes(6 << 30)).unwrap_or(0);
        }
        let per = t0.elapsed().as_secs_f64() / runs as f64;
        println!(
            "plan of a {}-node model (+ max batch for 6 GiB = {max_batch}): {:.3} ms",
            graph.nodes.len(),
            per * 1e3
        );
    }
}
