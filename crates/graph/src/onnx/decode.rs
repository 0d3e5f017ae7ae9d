//! Decoding of ONNX tensors and attributes into plain numbers.

use super::proto::{AttributeProto, DataType, NodeProto, TensorProto};

/// Why a `Constant` node or a tensor gives no values.
#[derive(Debug, thiserror::Error)]
pub(super) enum DecodeError {
    #[error("has no value")]
    NoValue,
    #[error("has an empty value")]
    EmptyValue,
    #[error("holds `{0}`, which is not a numeric tensor")]
    NotNumeric(String),
    #[error("tensor `{0}` keeps its data in an external file")]
    External(String),
    #[error("tensor `{tensor}` has element type {data_type:?}")]
    ElementType { tensor: String, data_type: DataType },
    #[error(
        "tensor `{tensor}` holds {have} values but its dims {dims:?} need {}",
        .need.map_or("an invalid count".into(), |n| n.to_string())
    )]
    Count {
        tensor: String,
        have: usize,
        dims: Vec<i64>,
        need: Option<usize>,
    },
}

/// The values as sizes, when all are positive.
pub(super) fn positive(v: &[i64]) -> Option<Vec<usize>> {
    v.iter()
        .map(|&x| usize::try_from(x).ok().filter(|&x| x > 0))
        .collect()
}

/// The sizes of a 2-D tensor, when both are positive.
pub(super) fn dims2(d: &[i64]) -> Option<[usize; 2]> {
    match positive(d)?[..] {
        [a, b] => Some([a, b]),
        _ => None,
    }
}

/// The element count of these dims, when they are valid.
pub(super) fn numel(dims: &[i64]) -> Option<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
}

/// Node attributes by name.
pub(super) struct Attrs<'a>(pub(super) &'a [AttributeProto]);

impl Attrs<'_> {
    /// The attribute `name`.
    pub(super) fn get(&self, name: &str) -> Option<&AttributeProto> {
        self.0.iter().find(|a| a.name == name)
    }

    /// Integer attribute `name`, or `default`.
    pub(super) fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).map_or(default, |a| a.i)
    }

    /// Float attribute `name`, or `default`.
    pub(super) fn float(&self, name: &str, default: f32) -> f32 {
        self.get(name).map_or(default, |a| a.f)
    }

    /// Integer list attribute `name`.
    pub(super) fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }

    /// String attribute `name` (lossy UTF-8).
    pub(super) fn string(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }
}

/// The tensor a `Constant` node holds.
pub(super) fn constant_value(n: &NodeProto) -> Result<TensorProto, DecodeError> {
    let a = n.attribute.first().ok_or(DecodeError::NoValue)?;
    let mut t = TensorProto {
        name: n.output[0].clone(),
        ..Default::default()
    };
    match a.name.as_str() {
        "value" => {
            let mut v = a.t.clone().ok_or(DecodeError::EmptyValue)?;
            v.name = t.name;
            return Ok(v);
        }
        "value_float" => {
            t.data_type = DataType::Float as i32;
            t.float_data = vec![a.f];
        }
        "value_floats" => {
            t.data_type = DataType::Float as i32;
            t.dims = vec![a.floats.len() as i64];
            t.float_data = a.floats.clone();
        }
        "value_int" => {
            t.data_type = DataType::Int64 as i32;
            t.int64_data = vec![a.i];
        }
        "value_ints" => {
            t.data_type = DataType::Int64 as i32;
            t.dims = vec![a.ints.len() as i64];
            t.int64_data = a.ints.clone();
        }
        other => return Err(DecodeError::NotNumeric(other.to_string())),
    }
    Ok(t)
}

/// The values of an integer tensor.
pub(super) fn tensor_ints(t: &TensorProto) -> Result<Vec<i64>, DecodeError> {
    let dt = DataType::try_from(t.data_type).unwrap_or(DataType::Undefined);
    let raw = &t.raw_data;
    let v: Vec<i64> = match dt {
        DataType::Int64 if raw.is_empty() => t.int64_data.clone(),
        DataType::Int64 => le_chunks::<8>(raw).map(i64::from_le_bytes).collect(),
        DataType::Int32 if raw.is_empty() => t.int32_data.iter().map(|&x| x as i64).collect(),
        DataType::Int32 => le_chunks::<4>(raw)
            .map(|b| i32::from_le_bytes(b) as i64)
            .collect(),
        _ => return tensor_floats(t).map(|v| v.iter().map(|&x| x as i64).collect()),
    };
    check_len(t, v)
}

/// The values of a numeric tensor, as `f64`.
pub(super) fn tensor_floats(t: &TensorProto) -> Result<Vec<f64>, DecodeError> {
    if t.data_location == 1 {
        return Err(DecodeError::External(t.name.clone()));
    }
    let dt = DataType::try_from(t.data_type).unwrap_or(DataType::Undefined);
    let raw = &t.raw_data;
    let from_i32 = || t.int32_data.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let v: Vec<f64> = match dt {
        DataType::Float if raw.is_empty() => t.float_data.iter().map(|&x| x as f64).collect(),
        DataType::Float => le_chunks::<4>(raw)
            .map(|b| f32::from_le_bytes(b) as f64)
            .collect(),
        DataType::Double if raw.is_empty() => t.double_data.clone(),
        DataType::Double => le_chunks::<8>(raw).map(f64::from_le_bytes).collect(),
        DataType::Int64 if raw.is_empty() => t.int64_data.iter().map(|&x| x as f64).collect(),
        DataType::Int64 => le_chunks::<8>(raw)
            .map(|b| i64::from_le_bytes(b) as f64)
            .collect(),
        DataType::Uint64 | DataType::Uint32 if raw.is_empty() => {
            t.uint64_data.iter().map(|&x| x as f64).collect()
        }
        DataType::Uint64 => le_chunks::<8>(raw)
            .map(|b| u64::from_le_bytes(b) as f64)
            .collect(),
        DataType::Uint32 => le_chunks::<4>(raw)
            .map(|b| u32::from_le_bytes(b) as f64)
            .collect(),
        DataType::Int32 if raw.is_empty() => from_i32(),
        DataType::Int32 => le_chunks::<4>(raw)
            .map(|b| i32::from_le_bytes(b) as f64)
            .collect(),
        DataType::Int16 | DataType::Uint16 | DataType::Int8 | DataType::Uint8 | DataType::Bool
            if raw.is_empty() =>
        {
            from_i32()
        }
        DataType::Int16 => le_chunks::<2>(raw)
            .map(|b| i16::from_le_bytes(b) as f64)
            .collect(),
        DataType::Uint16 => le_chunks::<2>(raw)
            .map(|b| u16::from_le_bytes(b) as f64)
            .collect(),
        DataType::Int8 => raw.iter().map(|&b| b as i8 as f64).collect(),
        DataType::Uint8 | DataType::Bool => raw.iter().map(|&b| b as f64).collect(),
        DataType::Float16 | DataType::Bfloat16 => {
            let bits: Vec<u16> = if raw.is_empty() {
                t.int32_data.iter().map(|&x| x as u16).collect()
            } else {
                le_chunks::<2>(raw).map(u16::from_le_bytes).collect()
            };
            bits.into_iter()
                .map(|b| {
                    if dt == DataType::Float16 {
                        f16_to_f64(b)
                    } else {
                        f32::from_bits((b as u32) << 16) as f64
                    }
                })
                .collect()
        }
        other => {
            return Err(DecodeError::ElementType {
                tensor: t.name.clone(),
                data_type: other,
            });
        }
    };
    check_len(t, v)
}

/// The values of a `float` or `double` tensor as `f32` (trained weights); `None` for
/// other element types, external data or a value count that does not fit the dims.
pub(super) fn tensor_f32(t: &TensorProto) -> Option<Vec<f32>> {
    if t.data_location == 1 {
        return None;
    }
    let raw = &t.raw_data;
    let v: Vec<f32> = match DataType::try_from(t.data_type).ok()? {
        DataType::Float if raw.is_empty() => t.float_data.clone(),
        DataType::Float => le_chunks::<4>(raw).map(f32::from_le_bytes).collect(),
        DataType::Double if raw.is_empty() => t.double_data.iter().map(|&x| x as f32).collect(),
        DataType::Double => le_chunks::<8>(raw)
            .map(|b| f64::from_le_bytes(b) as f32)
            .collect(),
        _ => return None,
    };
    check_len(t, v).ok()
}

/// Whether an ONNX element type is an integer type.
pub(super) fn is_int_type(data_type: i32) -> bool {
    matches!(
        DataType::try_from(data_type),
        Ok(DataType::Int64
            | DataType::Int32
            | DataType::Int16
            | DataType::Int8
            | DataType::Uint64
            | DataType::Uint32
            | DataType::Uint16
            | DataType::Uint8)
    )
}

/// The values, when their count fits the tensor's dims.
pub(super) fn check_len<T>(t: &TensorProto, v: Vec<T>) -> Result<Vec<T>, DecodeError> {
    match numel(&t.dims) {
        Some(n) if n == v.len() => Ok(v),
        need => Err(DecodeError::Count {
            tensor: t.name.clone(),
            have: v.len(),
            dims: t.dims.clone(),
            need,
        }),
    }
}

/// Refuses an initializer whose stored values do not fill its dims (a corrupt
/// or hand-edited file): every rule that reads a size off an initializer's
/// dims, a Gemm's output features from its weight, can then trust them.
/// Tensors kept in an external file, and strings, are not counted here.
pub(super) fn check_stored(t: &TensorProto) -> Result<(), DecodeError> {
    use DataType::*;
    if t.data_location == 1 {
        return Ok(());
    }
    let Ok(data_type) = DataType::try_from(t.data_type) else {
        return Ok(());
    };
    let width = match data_type {
        Uint8 | Int8 | Bool => 1,
        Uint16 | Int16 | Float16 | Bfloat16 => 2,
        Float | Int32 | Uint32 => 4,
        Double | Int64 | Uint64 | Complex64 => 8,
        Complex128 => 16,
        String | Undefined => return Ok(()),
    };
    let (have, whole) = if t.raw_data.is_empty() {
        let typed = match data_type {
            Float => t.float_data.len(),
            Complex64 => t.float_data.len() / 2,
            Double => t.double_data.len(),
            Complex128 => t.double_data.len() / 2,
            Int64 => t.int64_data.len(),
            Uint32 | Uint64 => t.uint64_data.len(),
            _ => t.int32_data.len(),
        };
        (typed, true)
    } else {
        (
            t.raw_data.len() / width,
            t.raw_data.len().is_multiple_of(width),
        )
    };
    match numel(&t.dims) {
        Some(n) if n == have && whole => Ok(()),
        need => Err(DecodeError::Count {
            tensor: t.name.clone(),
            have,
            dims: t.dims.clone(),
            need,
        }),
    }
}

/// Little-endian `N`-byte groups of raw tensor data.
pub(super) fn le_chunks<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    raw.chunks_exact(N)
        .map(|c| c.try_into().expect("chunks_exact"))
}

/// IEEE half precision to double.
pub(super) fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((bits >> 10) & 0x1f) as i32;
    let frac = (bits & 0x3ff) as f64;
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_raw_and_typed_values() {
        let t = TensorProto {
            dims: vec![3],
            data_type: DataType::Int64 as i32,
            raw_data: [0i64, -1, 234]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            ..Default::default()
        };
        assert_eq!(tensor_ints(&t).unwrap(), vec![0, -1, 234]);
        let h = TensorProto {
            data_type: DataType::Float16 as i32,
            int32_data: vec![0x4d00], // 20.0
            ..Default::default()
        };
        assert_eq!(tensor_floats(&h).unwrap(), vec![20.0]);
        let short = TensorProto {
            dims: vec![4],
            data_type: DataType::Float as i32,
            float_data: vec![1.0],
            ..Default::default()
        };
        assert!(
            tensor_floats(&short)
                .unwrap_err()
                .to_string()
                .contains("need 4")
        );
    }
}
