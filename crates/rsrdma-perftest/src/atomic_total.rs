//! An rs-only check of what the peer's atomics did (`RSRDMA_PERFTEST_ATOMIC_TOTAL=1`): the
//! passive side of an atomic test sums its target areas as 64-bit words before and after the
//! run and prints the difference. perftest's fetch-and-add adds 1 per operation, so after a
//! run of N iterations the total is +N (address cycling spreads them over several words; the
//! sum does not care); its compare-and-swap (compare 0, swap 0) leaves it at +0.

use crate::error::{Ctx, Result};
use crate::out::Out;
use crate::resources::Res;

/// The environment variable that turns the check on.
pub const ENV: &str = "RSRDMA_PERFTEST_ATOMIC_TOTAL";

/// Whether the check is on.
pub fn enabled() -> bool {
    std::env::var(ENV).is_ok_and(|v| v == "1")
}

/// The wrapping sum of every 64-bit word of the target areas.
///
/// # Errors
/// A failed read of the region.
pub fn sum_targets(res: &Res) -> Result<u64> {
    let q = res.qps.len();
    let mut bytes = vec![0u8; q * res.buff];
    res.mr
        .read_at(q * res.buff, &mut bytes)
        .ctx(" Couldn't read the target areas")?;
    Ok(sum_words(&bytes))
}

/// The wrapping sum of `bytes` read as little-endian 64-bit words (a short tail is ignored).
pub fn sum_words(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).fold(0u64, |acc, w| {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        acc.wrapping_add(u64::from_le_bytes(b))
    })
}

/// Prints the change since `before`: ` atomic target total: +N`.
///
/// # Errors
/// A failed read of the region.
pub fn report(res: &Res, before: u64, o: &mut Out<'_>) -> Result<()> {
    let added = sum_targets(res)?.wrapping_sub(before);
    o.text(&format!(" atomic target total: +{added}\n"));
    o.flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_wrap_and_see_adds_anywhere() {
        let mut b = vec![0xffu8; 24];
        let before = sum_words(&b);
        // Fetch-and-add of 1 on word 0 (wraps to 0) and twice on word 2.
        b[..8].copy_from_slice(&0u64.to_le_bytes());
        b[16..].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(sum_words(&b).wrapping_sub(before), 3);
        assert_eq!(sum_words(&b[..12]), sum_words(&b[..8]));
    }
}
