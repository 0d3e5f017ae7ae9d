//! Units that must not be mixed up with bare numbers.

use serde::{Serialize, Serializer};
use std::fmt;
use std::ops::{Add, AddAssign, Mul, Sub};

/// A number of bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);

impl Bytes {
    /// Whether this is no bytes at all.
    pub fn is_zero(&self) -> bool {
        self.0 == 0
    }

    /// Bytes in a KiB.
    pub const KIB: u64 = 1 << 10;
    /// Bytes in a MiB.
    pub const MIB: u64 = 1 << 20;
    /// Bytes in a GiB.
    pub const GIB: u64 = 1 << 30;

    /// Bytes as a float, for ratios and fits.
    pub fn as_f64(self) -> f64 {
        self.0 as f64
    }

    /// Parses `6GiB`, `512MiB`, `4GB` (decimal), `1.5 GiB` or a plain byte count.
    pub fn parse(text: &str) -> Result<Bytes, ParseBytesError> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: f64 = num.parse().map_err(|source| ParseBytesError::NotASize {
            text: text.to_string(),
            source,
        })?;
        let scale = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kib" => 1024.0,
            "m" | "mib" => 1024.0 * 1024.0,
            "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
            "t" | "tib" => 1024f64.powi(4),
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            other => {
                return Err(ParseBytesError::UnknownUnit {
                    text: text.to_string(),
                    unit: other.to_string(),
                });
            }
        };
        let bytes = value * scale;
        if !bytes.is_finite() || bytes < 1.0 {
            return Err(ParseBytesError::NotPositive {
                text: text.to_string(),
            });
        }
        Ok(Bytes(bytes as u64))
    }
}

/// Why a text is not a size ([`Bytes::parse`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseBytesError {
    /// The number in front is not a number.
    #[error("`{text}` is not a size like 6GiB, 512MiB or 4GB")]
    NotASize {
        /// The text as given.
        text: String,
        /// Why the number did not parse.
        #[source]
        source: std::num::ParseFloatError,
    },
    /// The unit is none of the known ones.
    #[error("`{text}`: unknown unit `{unit}` (use B, KiB, MiB, GiB, KB, MB, GB)")]
    UnknownUnit {
        /// The text as given.
        text: String,
        /// The unit, lowercased.
        unit: String,
    },
    /// The size is zero, below one byte or not finite.
    #[error("`{text}` must be a positive size")]
    NotPositive {
        /// The text as given.
        text: String,
    },
}

impl fmt::Display for Bytes {
    /// Binary units with three significant digits: `1.23 GiB`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0 as f64;
        let (v, u) = if b >= Bytes::GIB as f64 {
            (b / Bytes::GIB as f64, "GiB")
        } else if b >= Bytes::MIB as f64 {
            (b / Bytes::MIB as f64, "MiB")
        } else if b >= Bytes::KIB as f64 {
            (b / Bytes::KIB as f64, "KiB")
        } else {
            return write!(f, "{} B", self.0);
        };
        let digits = if v >= 100.0 {
            0
        } else if v >= 10.0 {
            1
        } else {
            2
        };
        write!(f, "{v:.digits$} {u}")
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl Add for Bytes {
    type Output = Bytes;
    fn add(self, o: Bytes) -> Bytes {
        Bytes(self.0 + o.0)
    }
}

impl AddAssign for Bytes {
    fn add_assign(&mut self, o: Bytes) {
        self.0 += o.0;
    }
}

impl Sub for Bytes {
    type Output = Bytes;
    fn sub(self, o: Bytes) -> Bytes {
        Bytes(self.0.saturating_sub(o.0))
    }
}

impl Mul<u64> for Bytes {
    type Output = Bytes;
    fn mul(self, n: u64) -> Bytes {
        Bytes(self.0 * n)
    }
}

impl std::iter::Sum for Bytes {
    fn sum<I: Iterator<Item = Bytes>>(it: I) -> Bytes {
        Bytes(it.map(|b| b.0).sum())
    }
}

/// A count of floating-point operations (a multiply-add is two).
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd, Serialize)]
pub struct Flops(pub f64);

impl fmt::Display for Flops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        let (x, u) = if v >= 1e12 {
            (v / 1e12, "TFLOP")
        } else if v >= 1e9 {
            (v / 1e9, "GFLOP")
        } else if v >= 1e6 {
            (v / 1e6, "MFLOP")
        } else if v >= 1e3 {
            (v / 1e3, "kFLOP")
        } else {
            (v, "FLOP")
        };
        write!(f, "{x:.3} {u}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(Bytes::parse("6GiB").unwrap(), Bytes(6 << 30));
        assert_eq!(Bytes::parse("512 MiB").unwrap(), Bytes(512 << 20));
        assert_eq!(Bytes::parse("4GB").unwrap(), Bytes(4_000_000_000));
        assert_eq!(Bytes::parse("1.5GiB").unwrap(), Bytes(3 << 29));
        assert!(matches!(
            Bytes::parse("0"),
            Err(ParseBytesError::NotPositive { .. })
        ));
        assert!(matches!(
            Bytes::parse("-1GiB"),
            Err(ParseBytesError::NotASize { .. })
        ));
        let e = Bytes::parse("6 parsecs").unwrap_err();
        assert_eq!(
            e.to_string(),
            "`6 parsecs`: unknown unit `parsecs` (use B, KiB, MiB, GiB, KB, MB, GB)"
        );
    }

    #[test]
    fn displays_three_significant_digits() {
        assert_eq!(Bytes(6 << 30).to_string(), "6.00 GiB");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB");
        assert_eq!(Bytes(100).to_string(), "100 B");
    }
}
