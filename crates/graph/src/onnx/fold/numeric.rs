//! The spec's element-wise arithmetic, comparisons and selections on dense constants,
//! with numpy broadcasting: what [`super::Importer::fold`] evaluates when no activation
//! reaches a node.

use super::{Dense, Why};
use crate::onnx::decode::Attrs;

/// Numpy broadcasting of two dense tensors through `f`.
fn broadcast(x: &Dense, y: &Dense, f: impl Fn(f32, f32) -> f32) -> Result<Dense, Why> {
    let rank = x.dims.len().max(y.dims.len());
    let pad = |d: &[usize]| {
        let mut v = vec![1; rank - d.len()];
        v.extend(d);
        v
    };
    let (dx, dy) = (pad(&x.dims), pad(&y.dims));
    let dims = dx
        .iter()
        .zip(&dy)
        .map(|(&p, &q)| match (p, q) {
            (p, q) if p == q || q == 1 => Ok(p),
            (1, q) => Ok(q),
            _ => Err(format!("cannot broadcast {:?} and {:?}", x.dims, y.dims)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let total = elements(&dims).ok_or_else(|| {
        format!(
            "broadcasting {:?} and {:?}: more elements than any model holds",
            x.dims, y.dims
        )
    })?;
    // Index of output element `i` in an operand of dims `d` (broadcast axes repeat).
    let index = |d: &[usize], mut i: usize| {
        let (mut at, mut stride) = (0, 1);
        for k in (0..rank).rev() {
            let c = i % dims[k];
            i /= dims[k];
            if d[k] != 1 {
                at += c * stride;
            }
            stride *= d[k];
        }
        at
    };
    let values = (0..total)
        .map(|i| f(x.values[index(&dx, i)], y.values[index(&dy, i)]))
        .collect();
    Ok(Dense { dims, values })
}

/// Most elements a folded constant may have: 2^26 (256 MiB of f32). What exports
/// fold is a mask, a position table or an index grid (a causal mask over 8,192
/// tokens has 2^26); a larger one is an input's mistake, and building it would
/// take the importer seconds and gigabytes.
const MAX_FOLDED: usize = 1 << 26;

/// The element count of `dims`, where it is at most [`MAX_FOLDED`].
fn elements(dims: &[usize]) -> Option<usize> {
    dims.iter()
        .try_fold(1usize, |p, &d| p.checked_mul(d))
        .filter(|&total| total <= MAX_FOLDED)
}

/// The spec's element-wise functions of one input, as they fold on constants (a
/// rotary embedding's `Cos`/`Sin` of its frequencies, T5's `Log`/`Abs` of relative
/// positions); `None` for any other op.
pub(super) fn unary_fn(op: &str) -> Option<fn(f32) -> f32> {
    Some(match op {
        "Sqrt" => f32::sqrt,
        "Neg" => |v| -v,
        "Not" => |v| f32::from(v == 0.0),
        "Abs" => f32::abs,
        "Exp" => f32::exp,
        "Log" => f32::ln,
        "Cos" => f32::cos,
        "Sin" => f32::sin,
        "Tan" => f32::tan,
        "Tanh" => f32::tanh,
        "Reciprocal" => |v| 1.0 / v,
        "Floor" => f32::floor,
        "Ceil" => f32::ceil,
        // Halves to even, as the spec says.
        "Round" => f32::round_ties_even,
        "Sign" => |v| if v == 0.0 { 0.0 } else { v.signum() },
        "Relu" => |v| v.max(0.0),
        "Sigmoid" => |v| 1.0 / (1.0 + (-v).exp()),
        _ => return None,
    })
}

/// Element-wise ops, `Expand`, `Trilu` and `Where` on dense constants.
pub(super) fn numeric(op: &str, mut data: Vec<Dense>, a: &Attrs) -> Result<Dense, Why> {
    let unary = |d: Dense, f: fn(f32) -> f32| Dense {
        values: d.values.iter().map(|&v| f(v)).collect(),
        ..d
    };
    if data.is_empty() {
        return Err(format!("{op} needs an input"));
    }
    let x = data.remove(0);
    let arg = |k: usize| {
        data.get(k)
            .ok_or_else(|| format!("{op} needs input {}", k + 1))
    };
    if let Some(f) = unary_fn(op) {
        return Ok(unary(x, f));
    }
    match op {
        "Add" => broadcast(&x, arg(0)?, |p, q| p + q),
        "Sub" => broadcast(&x, arg(0)?, |p, q| p - q),
        "Mul" => broadcast(&x, arg(0)?, |p, q| p * q),
        // Integer division truncates; a shape computation's `Div` of integers is
        // exact or handled as shape values (`shapes`), so the float quotient stands.
        "Div" => broadcast(&x, arg(0)?, |p, q| p / q),
        "Pow" => broadcast(&x, arg(0)?, f32::powf),
        // Variadic in the spec: folded pairwise, left to right.
        "Min" => data
            .iter()
            .try_fold(x, |acc, d| broadcast(&acc, d, f32::min)),
        "Max" => data
            .iter()
            .try_fold(x, |acc, d| broadcast(&acc, d, f32::max)),
        // `fmod = 1` is C's remainder (the dividend's sign), else Python's (the divisor's).
        "Mod" if a.int("fmod", 0) != 0 => broadcast(&x, arg(0)?, |p, q| p % q),
        "Mod" => broadcast(&x, arg(0)?, |p, q| p - q * (p / q).floor()),
        "Equal" => broadcast(&x, arg(0)?, |p, q| f32::from(p == q)),
        "Less" => broadcast(&x, arg(0)?, |p, q| f32::from(p < q)),
        "LessOrEqual" => broadcast(&x, arg(0)?, |p, q| f32::from(p <= q)),
        "Greater" => broadcast(&x, arg(0)?, |p, q| f32::from(p > q)),
        "GreaterOrEqual" => broadcast(&x, arg(0)?, |p, q| f32::from(p >= q)),
        "And" => broadcast(&x, arg(0)?, |p, q| f32::from(p != 0.0 && q != 0.0)),
        "Or" => broadcast(&x, arg(0)?, |p, q| f32::from(p != 0.0 || q != 0.0)),
        "Xor" => broadcast(&x, arg(0)?, |p, q| f32::from((p != 0.0) != (q != 0.0))),
        // To an integer type the value truncates toward zero, to bool it is `!= 0`
        // (T5's relative position buckets: `log(...).to(torch.long)`).
        // Bounds from the inputs (opset 11 on), else the attributes (a padding computed in
        // the graph: timm's `pad_same` clips `(ceil(x / s) - 1) s + k - x` at zero).
        "Clip" => {
            let bound = |k: usize, name: &str, none: f32| match data.get(k) {
                Some(d) => d.values.first().copied().unwrap_or(none),
                None => a.float(name, none),
            };
            let (lo, hi) = (bound(0, "min", f32::MIN), bound(1, "max", f32::MAX));
            Ok(Dense {
                // `max` then `min`, never `clamp` (which panics where min > max).
                values: x.values.iter().map(|&v| v.max(lo).min(hi)).collect(),
                ..x
            })
        }
        "Cast" if a.int("to", 1) == 9 => Ok(unary(x, |v| f32::from(v != 0.0))),
        "Cast" => Ok(unary(x, f32::trunc)),
        "Expand" => {
            let shape = arg(0)?;
            let dims: Vec<usize> = shape
                .values
                .iter()
                .map(|&v| (v >= 0.0).then_some(v as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| format!("Expand to {:?}: a negative size", shape.values))?;
            let total = elements(&dims)
                .ok_or_else(|| format!("Expand to {dims:?}: more elements than any model holds"))?;
            let ones = Dense {
                dims,
                values: vec![1.0; total],
            };
            broadcast(&x, &ones, |p, _| p)
        }
        // Each axis repeated `repeats[i]` times (XCiT's Fourier positions: `arange(H)
        // .view(1, H, 1).repeat(1, 1, W)`).
        "Tile" => {
            let repeats = arg(0)?;
            if repeats.values.len() != x.dims.len() || repeats.values.iter().any(|&r| r < 0.0) {
                return Err(format!(
                    "Tile of a rank-{} tensor by {:?}",
                    x.dims.len(),
                    repeats.values
                ));
            }
            let dims: Vec<usize> = (x.dims.iter())
                .zip(&repeats.values)
                .map(|(&d, &r)| d * r as usize)
                .collect();
            let total = elements(&dims)
                .ok_or_else(|| format!("Tile to {dims:?}: more elements than any model holds"))?;
            let mut values = Vec::with_capacity(total);
            let mut at = vec![0usize; dims.len()];
            for _ in 0..total {
                let source = at
                    .iter()
                    .zip(&x.dims)
                    .fold(0, |acc, (&i, &d)| acc * d + i % d);
                values.push(x.values[source]);
                for k in (0..dims.len()).rev() {
                    at[k] += 1;
                    if at[k] < dims[k] {
                        break;
                    }
                    at[k] = 0;
                }
            }
            Ok(Dense { dims, values })
        }
        "Where" => {
            let picked = broadcast(&x, arg(0)?, |c, p| if c != 0.0 { p } else { f32::NAN })?;
            let other = broadcast(&x, arg(1)?, |c, q| if c != 0.0 { f32::NAN } else { q })?;
            // Exactly one side of each element is a number: take it.
            broadcast(&picked, &other, |p, q| if p.is_nan() { q } else { p })
        }
        // `out[i_0, .., i_k, ..] = x[i_0, .., indices[i_0, .., i_k, ..], ..]` along `axis`;
        // the output has the indices' shape. Along other axes an index may exceed only
        // axes of size 1 in `x` (a buffer expanded over the batch, read as its one row).
        "GatherElements" => {
            let indices = arg(0)?;
            let r = x.dims.len();
            if indices.dims.len() != r {
                return Err(format!(
                    "GatherElements indices of rank {} for data of rank {r}",
                    indices.dims.len()
                ));
            }
            let axis = a.int("axis", 0);
            let axis = usize::try_from(if axis < 0 { axis + r as i64 } else { axis })
                .ok()
                .filter(|&k| k < r)
                .ok_or_else(|| format!("GatherElements axis {axis} of rank {r}"))?;
            let mut values = Vec::with_capacity(indices.values.len());
            for (flat, &i) in indices.values.iter().enumerate() {
                let (mut rest, mut at, mut stride) = (flat, 0usize, 1usize);
                for k in (0..r).rev() {
                    let c = rest % indices.dims[k];
                    rest /= indices.dims[k];
                    let c = match k == axis {
                        true => {
                            let size = x.dims[k] as i64;
                            let i = if i < 0.0 { i as i64 + size } else { i as i64 };
                            if !(0..size).contains(&i) {
                                return Err(format!("GatherElements index {i} outside {size}"));
                            }
                            i as usize
                        }
                        false if x.dims[k] == 1 => 0,
                        false if c < x.dims[k] => c,
                        false => {
                            return Err(format!(
                                "GatherElements indices of dims {:?} exceed data of dims {:?}",
                                indices.dims, x.dims
                            ));
                        }
                    };
                    at += c * stride;
                    stride *= x.dims[k];
                }
                values.push(x.values[at]);
            }
            Ok(Dense {
                dims: indices.dims.clone(),
                values,
            })
        }
        // `data[indices[i]] = updates[i]`: each index tuple of the last axis's length
        // addresses one slice of `data` (PyTorch's `mask[a:b, c:d] = v` on a constant).
        "ScatterND" => {
            if a.string("reduction").is_some_and(|r| r != "none") {
                return Err("ScatterND with a reduction".into());
            }
            let (indices, updates) = (arg(0)?, arg(1)?);
            let k = *indices.dims.last().ok_or("ScatterND indices of rank 0")?;
            if k == 0 || k > x.dims.len() {
                return Err(format!(
                    "ScatterND indices of dims {:?} into data of dims {:?}",
                    indices.dims, x.dims
                ));
            }
            let slice: usize = x.dims[k..].iter().product();
            let tuples = indices.values.len() / k;
            if updates.values.len() != tuples * slice {
                return Err(format!(
                    "ScatterND updates of dims {:?} for {tuples} slices of {slice}",
                    updates.dims
                ));
            }
            let mut values = x.values.clone();
            for (t, tuple) in indices.values.chunks(k).enumerate() {
                let mut at = 0usize;
                for (axis, &i) in tuple.iter().enumerate() {
                    let size = x.dims[axis] as i64;
                    let i = if i < 0.0 { i as i64 + size } else { i as i64 };
                    if !(0..size).contains(&i) {
                        return Err(format!("ScatterND index {i} outside axis {axis} of {size}"));
                    }
                    at = at * x.dims[axis] + i as usize;
                }
                values[at * slice..(at + 1) * slice]
                    .copy_from_slice(&updates.values[t * slice..(t + 1) * slice]);
            }
            Ok(Dense { values, ..x })
        }
        "Trilu" => {
            let k = data
                .first()
                .and_then(|d| d.values.first())
                .map_or(0, |&v| v as i64);
            let upper = a.int("upper", 1) != 0;
            let r = x.dims.len();
            if r < 2 {
                return Err("Trilu needs rank 2 or more".into());
            }
            let (rows, cols) = (x.dims[r - 2], x.dims[r - 1]);
            let values = x
                .values
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let (row, col) = (((i / cols) % rows) as i64, (i % cols) as i64);
                    let keep = if upper {
                        col - row >= k
                    } else {
                        col - row <= k
                    };
                    if keep { v } else { 0.0 }
                })
                .collect();
            Ok(Dense { values, ..x })
        }
        _ => unreachable!("not a numeric op"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_repeats_each_axis_its_number_of_times() {
        let x = Dense {
            dims: vec![1, 2, 1],
            values: vec![1.0, 2.0],
        };
        let repeats = Dense {
            dims: vec![3],
            values: vec![2.0, 1.0, 3.0],
        };
        let y = numeric("Tile", vec![x, repeats], &Attrs(&[])).unwrap();
        assert_eq!(y.dims, [2, 2, 3]);
        let want = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0];
        assert_eq!(y.values, [want, want].concat());
    }
}
