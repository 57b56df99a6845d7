//! Rendezvous (highest random weight) hashing: each cluster prefers the
//! live member with the highest hash of (cluster, member). A membership
//! change moves only the clusters whose preferred member changed.

/// FNV-1a, 64 bits: stable across processes and versions (unlike std's
/// randomly seeded hasher), which every replica must agree on.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    // A final mix so that similar names spread well.
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}

/// The member `cluster` should be owned by, if any member is live.
pub fn preferred<'m>(cluster: &str, members: impl IntoIterator<Item = &'m str>) -> Option<&'m str> {
    members
        .into_iter()
        .max_by_key(|member| (fnv1a(&[cluster, member]), *member))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn spreads_evenly_and_moves_little_on_change() {
        let three = ["r1", "r2", "r3"];
        let clusters: Vec<String> = (0..3000).map(|i| format!("cluster-{i}")).collect();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for c in &clusters {
            *counts.entry(preferred(c, three).unwrap()).or_default() += 1;
        }
        for member in three {
            let share = counts[member];
            assert!((800..1200).contains(&share), "{member} has {share} of 3000");
        }
        let four = ["r1", "r2", "r3", "r4"];
        let moved = clusters
            .iter()
            .filter(|c| preferred(c, three) != preferred(c, four))
            .count();
        assert!(
            moved < 1000,
            "{moved} of 3000 moved when a fourth member joined"
        );
        assert!(clusters
            .iter()
            .filter(|c| preferred(c, three) != preferred(c, four))
            .all(|c| preferred(c, four) == Some("r4")));
        assert_eq!(preferred("x", std::iter::empty::<&str>()), None);
    }
}
