//! `Einsum` of two operands, rewritten before import into the ops the importer
//! already reads (`Transpose`, `Unsqueeze`, `MatMul`, `Squeeze`), so that what
//! it computes goes through the same shape, layout and parameter rules as a
//! written-out product: an attention's `bhqd,bhkd->bhqk`, a projection's
//! `btd,dh->bth` (a linear layer, the weight first or second).
//!
//! The labels of the two operands A and B fall into four kinds: in both and in
//! the output (batch, broadcast), in both and not in the output (contracted),
//! in A only, in B only. With at most one contracted label and one label of
//! B only (the operands swapped where that makes it so), the product is one
//! batched `MatMul`: A as `[its other labels..., L, K]`, B as `[the same
//! leading labels or 1..., K, R]` (those before B's first left out: `MatMul`
//! broadcasts from the right), an absent L, K or R an axis of size 1.
//! Ellipses, a label repeated in one operand (a diagonal), a label summed in
//! one operand only, several contracted labels and more or fewer than two
//! operands are refused with the node named.
//!
//! An `Einsum` that no graph input reaches (a relative-position table read
//! through constant one-hot lookups, TensorFlow's MaxViT) is not lowered: the
//! constant evaluator computes it ([`evaluate`]).

use super::import::{is_default, label};
use super::proto::{AttributeProto, AttributeType, DataType, NodeProto, TensorProto};
use crate::error::GraphError;

/// `nodes` (in topological order) with each `Einsum` of the default domain that a
/// graph input reaches replaced by its ops. `is_weight` tells an initializer's name:
/// a product with one is a linear layer when the weight comes second.
pub(super) fn lower(
    nodes: Vec<NodeProto>,
    opset: i64,
    graph_inputs: &[String],
    is_weight: impl Fn(&str) -> bool,
) -> Result<Vec<NodeProto>, GraphError> {
    let mut reached: std::collections::HashSet<&str> = graph_inputs
        .iter()
        .map(String::as_str)
        .filter(|name| !is_weight(name))
        .collect();
    let mut keep = Vec::with_capacity(nodes.len());
    for n in &nodes {
        let reads_input = n.input.iter().any(|i| reached.contains(i.as_str()));
        if reads_input {
            reached.extend(n.output.iter().map(String::as_str));
        }
        keep.push(!reads_input);
    }
    let mut out = Vec::with_capacity(nodes.len());
    for (n, constant) in nodes.into_iter().zip(keep) {
        if is_default(&n) && n.op_type == "Einsum" && !constant {
            out.extend(lower_one(&n, opset, &is_weight)?);
        } else {
            out.push(n);
        }
    }
    Ok(out)
}

/// The element-wise product summed over the labels absent from the output, of
/// constant operands of `dims` (row-major `values`): ONNX `Einsum` of any number of
/// operands without an ellipsis. `Err` says why it cannot be evaluated.
pub(super) fn evaluate(
    equation: &str,
    operands: &[(&[usize], &[f32])],
) -> Result<(Vec<usize>, Vec<f32>), String> {
    // Above this many terms a fold would take seconds; no export's table needs it.
    const MAX_TERMS: usize = 100_000_000;
    let (inputs, out) = split(equation)?;
    if inputs.len() != operands.len() {
        return Err(format!(
            "{} operands for an equation of {}",
            operands.len(),
            inputs.len()
        ));
    }
    let mut size: Vec<(char, usize)> = Vec::new();
    for (labels, (dims, _)) in inputs.iter().zip(operands) {
        if let Some((i, &c)) = labels
            .iter()
            .enumerate()
            .find(|(i, c)| labels[..*i].contains(c))
        {
            return Err(format!(
                "label `{c}` appears twice in one operand (axis {i}): a diagonal is not supported"
            ));
        }
        if labels.len() != dims.len() {
            return Err(format!(
                "`{}` for an operand of rank {}",
                String::from_iter(labels),
                dims.len()
            ));
        }
        for (&c, &d) in labels.iter().zip(dims.iter()) {
            match size.iter().find(|(l, _)| *l == c) {
                Some(&(_, s)) if s != d && s != 1 && d != 1 => {
                    return Err(format!("label `{c}` is {s} and {d} long"));
                }
                Some(_) => {}
                None => size.push((c, d)),
            }
            if let Some(e) = size.iter_mut().find(|(l, _)| *l == c) {
                e.1 = e.1.max(d);
            }
        }
    }
    if let Some(c) = out.iter().find(|c| !size.iter().any(|(l, _)| l == *c)) {
        return Err(format!("output label `{c}` is in no operand"));
    }
    // Every label, the output's first: one odometer over all of them.
    let mut labels = out.clone();
    labels.extend(size.iter().map(|&(c, _)| c).filter(|c| !out.contains(c)));
    let lens: Vec<usize> = labels
        .iter()
        .map(|c| size.iter().find(|(l, _)| l == c).map_or(1, |&(_, s)| s))
        .collect();
    let terms = lens.iter().try_fold(1usize, |acc, &l| acc.checked_mul(l));
    if terms.is_none_or(|t| t > MAX_TERMS) {
        return Err(format!("{equation} has more than {MAX_TERMS} terms to sum"));
    }
    // Per operand, the stride each label steps it by (0 where it lacks the label or
    // broadcasts it).
    let strides: Vec<Vec<usize>> = inputs
        .iter()
        .zip(operands)
        .map(|(ls, (dims, _))| {
            labels
                .iter()
                .map(|c| {
                    ls.iter().rposition(|l| l == c).map_or(0, |k| {
                        if dims[k] == 1 {
                            0
                        } else {
                            dims[k + 1..].iter().product()
                        }
                    })
                })
                .collect()
        })
        .collect();
    let out_dims: Vec<usize> = lens[..out.len()].to_vec();
    let inner: usize = lens[out.len()..].iter().product();
    let mut values = vec![0f32; out_dims.iter().product()];
    let mut idx = vec![0usize; labels.len()];
    for (o, value) in values.iter_mut().enumerate() {
        let mut rest = o;
        for k in (0..out.len()).rev() {
            idx[k] = rest % lens[k];
            rest /= lens[k];
        }
        let mut sum = 0f32;
        for t in 0..inner {
            let mut rest = t;
            for k in (out.len()..labels.len()).rev() {
                idx[k] = rest % lens[k];
                rest /= lens[k];
            }
            let mut term = 1f32;
            for (s, (_, v)) in strides.iter().zip(operands) {
                let at: usize = s.iter().zip(&idx).map(|(a, b)| a * b).sum();
                term *= v[at];
            }
            sum += term;
        }
        *value = sum;
    }
    Ok((out_dims, values))
}

/// The equation's operands and output as label lists.
struct Equation {
    a: Vec<char>,
    b: Vec<char>,
    out: Vec<char>,
}

/// The operands' labels and the output's (implicit: the labels that appear once, in
/// alphabetical order), without whitespace; an ellipsis is refused.
fn split(eq: &str) -> Result<(Vec<Vec<char>>, Vec<char>), String> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    if eq.contains("...") {
        return Err("an ellipsis (`...`) is not supported; name every axis".into());
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let operands: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    let out = match rhs {
        Some(r) => r.chars().collect(),
        None => {
            let all: Vec<char> = operands.iter().flatten().copied().collect();
            let mut once: Vec<char> = all
                .iter()
                .copied()
                .filter(|c| all.iter().filter(|l| *l == c).count() == 1)
                .collect();
            once.sort_unstable();
            once
        }
    };
    Ok((operands, out))
}

fn parse(eq: &str) -> Result<Equation, String> {
    let (operands, out) = split(eq)?;
    let [a, b] = &operands[..] else {
        return Err(format!(
            "{} operands: only a product of two is supported",
            operands.len()
        ));
    };
    for (which, labels) in [("first", a), ("second", b)] {
        if let Some(&c) = labels.iter().find(|c| !c.is_ascii_alphabetic()) {
            return Err(format!("`{c}` in the {which} operand is not a label"));
        }
        if let Some((i, &c)) = labels
            .iter()
            .enumerate()
            .find(|(i, c)| labels[..*i].contains(c))
        {
            return Err(format!(
                "label `{c}` appears twice in the {which} operand (axis {i}): a diagonal is not supported"
            ));
        }
    }
    for (i, &c) in out.iter().enumerate() {
        if !a.contains(&c) && !b.contains(&c) {
            return Err(format!("output label `{c}` is in no operand"));
        }
        if out[..i].contains(&c) {
            return Err(format!("output label `{c}` appears twice"));
        }
    }
    for &c in a.iter().chain(b) {
        let contracted = a.contains(&c) && b.contains(&c);
        if !(out.contains(&c) || contracted) {
            return Err(format!(
                "label `{c}` is summed in one operand only: not supported"
            ));
        }
    }
    Ok(Equation {
        a: a.clone(),
        b: b.clone(),
        out,
    })
}

/// The ops of one `Einsum` node.
fn lower_one(
    n: &NodeProto,
    opset: i64,
    is_weight: &dyn Fn(&str) -> bool,
) -> Result<Vec<NodeProto>, GraphError> {
    let err = |why: String| GraphError::node(label(n), format!("Einsum {why}"));
    let eq = n
        .attribute
        .iter()
        .find(|a| a.name == "equation")
        .map(|a| String::from_utf8_lossy(&a.s).into_owned())
        .ok_or_else(|| err("has no equation".into()))?;
    let parsed = parse(&eq).map_err(|why| err(format!("`{eq}`: {why}")))?;
    let (Some(x), Some(y), Some(result)) = (n.input.first(), n.input.get(1), n.output.first())
    else {
        return Err(err(format!("`{eq}` needs two inputs and an output")));
    };
    let only = |p: &[char], q: &[char]| -> Vec<char> {
        p.iter().copied().filter(|c| !q.contains(c)).collect()
    };
    // B's own labels become one matrix axis: swap so that B has at most one, or
    // so that a weight comes second (the importer's linear layer) where either fits.
    let (mut a, mut b, mut x, mut y) = (&parsed.a, &parsed.b, x, y);
    let fits_swapped = only(a, b).len() <= 1;
    if fits_swapped && (only(b, a).len() > 1 || (is_weight(x) && !is_weight(y))) {
        (a, b, x, y) = (b, a, y, x);
    }
    let (left, right) = (only(a, b), only(b, a));
    let contracted: Vec<char> = a
        .iter()
        .copied()
        .filter(|c| b.contains(c) && !parsed.out.contains(c))
        .collect();
    if right.len() > 1 || contracted.len() > 1 {
        return Err(err(format!(
            "`{eq}`: {} labels of one operand only and {} contracted: one product needs at most one of each \
             (a reshape would merge them: not supported)",
            right.len().max(left.len()),
            contracted.len()
        )));
    }
    let l = left.last().copied();
    let (k, r) = (contracted.first().copied(), right.first().copied());
    let leading: Vec<char> = a
        .iter()
        .copied()
        .filter(|&c| Some(c) != l && Some(c) != k)
        .collect();
    let at = |labels: &[char], c: char| labels.iter().position(|&d| d == c).expect("a label");

    let name = label(n);
    let mut ops = Ops {
        name: &name,
        result,
        opset,
        nodes: Vec::new(),
    };
    // A: [leading..., L, K], an absent L or K as an axis of 1.
    let a_order: Vec<char> = leading.iter().copied().chain(l).chain(k).collect();
    let mut a_t = ops.transpose("a", x, a.iter().map(|&c| at(&a_order, c)), a);
    let m = leading.len() as i64;
    let a_ones: Vec<i64> = [(l.is_none(), m), (k.is_none(), m + 1)]
        .into_iter()
        .filter_map(|(absent, axis)| absent.then_some(axis))
        .collect();
    a_t = ops.unsqueeze("a", a_t, &a_ones);
    // B: A's leading labels it has (1 where it has not), then K and R.
    let b_order: Vec<char> = leading
        .iter()
        .copied()
        .filter(|c| b.contains(c))
        .chain(k)
        .chain(r)
        .collect();
    let mut b_t = ops.transpose("b", y, b.iter().map(|&c| at(&b_order, c)), b);
    // `MatMul` broadcasts from the right: leading labels before B's first need no axis.
    let skip = leading
        .iter()
        .position(|c| b.contains(c))
        .unwrap_or(leading.len());
    let mb = (leading.len() - skip) as i64;
    let mut b_ones: Vec<i64> = (skip..leading.len())
        .filter(|&i| !b.contains(&leading[i]))
        .map(|i| (i - skip) as i64)
        .collect();
    b_ones.extend(
        [(k.is_none(), mb), (r.is_none(), mb + 1)]
            .into_iter()
            .filter_map(|(absent, axis)| absent.then_some(axis)),
    );
    b_t = ops.unsqueeze("b", b_t, &b_ones);
    // [leading..., L or 1, R or 1], then the output's order.
    let product = ops.node("MatMul", "matmul", vec![a_t, b_t], vec![]);
    let squeezed: Vec<i64> = [(l.is_none(), m), (r.is_none(), m + 1)]
        .into_iter()
        .filter_map(|(absent, axis)| absent.then_some(axis))
        .collect();
    let product = ops.squeeze(product, &squeezed);
    let labels: Vec<char> = leading.iter().copied().chain(l).chain(r).collect();
    let perm: Vec<i64> = parsed.out.iter().map(|&c| at(&labels, c) as i64).collect();
    ops.finish(product, perm);
    Ok(ops.nodes)
}

/// The nodes written for one `Einsum`, named after it.
struct Ops<'a> {
    name: &'a str,
    result: &'a str,
    opset: i64,
    nodes: Vec<NodeProto>,
}

impl Ops<'_> {
    /// A node reading `inputs`; returns its output's name.
    fn node(
        &mut self,
        op: &str,
        part: &str,
        inputs: Vec<String>,
        attribute: Vec<AttributeProto>,
    ) -> String {
        let output = format!("{}/einsum/{part}", self.name);
        self.nodes.push(NodeProto {
            op_type: op.into(),
            name: output.clone(),
            input: inputs,
            output: vec![output.clone()],
            attribute,
            ..NodeProto::default()
        });
        output
    }

    /// `x` with its axes in `labels` order moved to where `to` says (the
    /// position of each input axis in the result); nothing when already there.
    fn transpose(
        &mut self,
        part: &str,
        x: &str,
        to: impl Iterator<Item = usize>,
        labels: &[char],
    ) -> String {
        let to: Vec<usize> = to.collect();
        let mut perm = vec![0i64; labels.len()];
        for (axis, &dest) in to.iter().enumerate() {
            perm[dest] = axis as i64;
        }
        if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
            return x.to_string();
        }
        self.node(
            "Transpose",
            &format!("{part}_transpose"),
            vec![x.to_string()],
            vec![ints("perm", &perm)],
        )
    }

    /// `x` with axes of size 1 inserted at `axes` (positions in the result).
    fn unsqueeze(&mut self, part: &str, x: String, axes: &[i64]) -> String {
        self.axes_op("Unsqueeze", &format!("{part}_unsqueeze"), x, axes)
    }

    /// `x` without its axes of size 1 at `axes`.
    fn squeeze(&mut self, x: String, axes: &[i64]) -> String {
        self.axes_op("Squeeze", "squeeze", x, axes)
    }

    /// `Unsqueeze`/`Squeeze`: axes an attribute before opset 13, an input from it on.
    fn axes_op(&mut self, op: &str, part: &str, x: String, axes: &[i64]) -> String {
        if axes.is_empty() {
            return x;
        }
        if self.opset < 13 {
            return self.node(op, part, vec![x], vec![ints("axes", axes)]);
        }
        let values = TensorProto {
            dims: vec![axes.len() as i64],
            data_type: DataType::Int64 as i32,
            int64_data: axes.to_vec(),
            ..TensorProto::default()
        };
        let constant = self.node(
            "Constant",
            &format!("{part}_axes"),
            vec![],
            vec![AttributeProto {
                name: "value".into(),
                t: Some(values),
                r#type: AttributeType::Tensor as i32,
                ..AttributeProto::default()
            }],
        );
        self.node(op, part, vec![x, constant], vec![])
    }

    /// The last op writes the `Einsum`'s own output: a transpose to the output's
    /// order, or an identity where the order is already the output's.
    fn finish(&mut self, x: String, perm: Vec<i64>) {
        let identity = perm.iter().enumerate().all(|(i, &p)| p == i as i64);
        let written_last = self.nodes.last().is_some_and(|n| n.output[0] == x);
        if identity && written_last {
            let last = self.nodes.last_mut().expect("checked");
            last.output = vec![self.result.to_string()];
            return;
        }
        let (op, attribute) = if identity {
            ("Identity", vec![])
        } else {
            ("Transpose", vec![ints("perm", &perm)])
        };
        self.nodes.push(NodeProto {
            op_type: op.into(),
            name: format!("{}/einsum/output", self.name),
            input: vec![x],
            output: vec![self.result.to_string()],
            attribute,
            ..NodeProto::default()
        });
    }
}

fn ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: values.to_vec(),
        r#type: AttributeType::Ints as i32,
        ..AttributeProto::default()
    }
}

#[cfg(test)]
mod tests {

    /// The evaluator against products written out: a matrix product, a transpose,
    /// an implicit output (the labels seen once, sorted), a sum over an axis.
    #[test]
    fn evaluate_computes_the_spec_products() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [2, 3]
        let b = [1.0, 0.0, 2.0, 1.0, 0.0, 3.0]; // [3, 2]
        let (dims, v) = evaluate("ik,kj->ij", &[(&[2, 3], &a), (&[3, 2], &b)]).unwrap();
        assert_eq!((dims, v), (vec![2, 2], vec![5.0, 11.0, 14.0, 23.0]));
        let (dims, v) = evaluate("ij->ji", &[(&[2, 3], &a)]).unwrap();
        assert_eq!((dims, v), (vec![3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
        let (dims, v) = evaluate("ik,kj", &[(&[2, 3], &a), (&[3, 2], &b)]).unwrap();
        assert_eq!((dims, v), (vec![2, 2], vec![5.0, 11.0, 14.0, 23.0]));
        let (dims, v) = evaluate("ij->i", &[(&[2, 3], &a)]).unwrap();
        assert_eq!((dims, v), (vec![2], vec![6.0, 15.0]));
        assert!(evaluate("ii->i", &[(&[2, 2], &a[..4])]).is_err());
        assert!(evaluate("ij,jk->ik", &[(&[2, 3], &a), (&[2, 3], &b)]).is_err());
    }

    use super::*;

    #[test]
    fn equations_are_read_and_refused_by_rule() {
        let e = parse("bhqd, bhkd -> bhqk").unwrap();
        assert_eq!((e.a.len(), e.b.len()), (4, 4));
        assert_eq!(e.out, ['b', 'h', 'q', 'k']);
        // Implicit output: the labels that appear once, sorted.
        assert_eq!(parse("ij,jk").unwrap().out, ['i', 'k']);
        for (eq, says) in [
            ("...ij,jk->...ik", "ellipsis"),
            ("ij,jk,kl->il", "3 operands"),
            ("ii,ij->j", "appears twice in the first"),
            ("ij,jk->iz", "`z` is in no operand"),
            ("ij,jk->iik", "appears twice"),
            ("ij,jk->k", "summed in one operand only"),
        ] {
            let err = parse(eq).err().unwrap_or_default();
            assert!(err.contains(says), "{eq}: {err}");
        }
    }
}
