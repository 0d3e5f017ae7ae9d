//! The entries of a shape value, symbolic in the batch and the sequence length.

/// One entry of a shape value: the symbolic batch or sequence length, a number, or a
/// product `B^b · T^t · n` (attention's `B·heads`). Built by [`Sym::of`], so each value
/// has one spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sym {
    Batch,
    Seq,
    N(i64),
    Prod { b: u32, t: u32, n: i64 },
}

impl Sym {
    /// `B^b · T^t · n` in its one spelling.
    pub(super) fn of(b: u32, t: u32, n: i64) -> Sym {
        match (b, t, n) {
            (0, 0, n) => Sym::N(n),
            (1, 0, 1) => Sym::Batch,
            (0, 1, 1) => Sym::Seq,
            (b, t, n) => Sym::Prod { b, t, n },
        }
    }

    /// The powers of the batch and the sequence length, and the number.
    pub(super) fn parts(self) -> (u32, u32, i64) {
        match self {
            Sym::Batch => (1, 0, 1),
            Sym::Seq => (0, 1, 1),
            Sym::N(n) => (0, 0, n),
            Sym::Prod { b, t, n } => (b, t, n),
        }
    }

    pub(super) fn mul(self, o: Sym) -> Sym {
        let ((b, t, n), (p, q, m)) = (self.parts(), o.parts());
        Sym::of(b + p, t + q, n.saturating_mul(m))
    }

    /// `self / o` when it divides exactly.
    pub(super) fn div(self, o: Sym) -> Option<Sym> {
        let ((b, t, n), (p, q, m)) = (self.parts(), o.parts());
        (b >= p && t >= q && m != 0 && n % m == 0).then(|| Sym::of(b - p, t - q, n / m))
    }

    /// Whether `self` divides `o` exactly (both positive).
    pub(super) fn divides(self, o: Sym) -> bool {
        o.div(self).is_some()
    }
}

impl std::fmt::Display for Sym {
    /// `B`, `T`, `16`, `B·4`, `B·T`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (b, t, n) = self.parts();
        let mut parts: Vec<String> = Vec::new();
        parts.extend(std::iter::repeat_n("B".to_string(), b as usize));
        parts.extend(std::iter::repeat_n("T".to_string(), t as usize));
        if n != 1 || parts.is_empty() {
            parts.push(n.to_string());
        }
        write!(f, "{}", parts.join("·"))
    }
}
