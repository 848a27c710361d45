//! Names under which a server's tools are published.

use crate::PrefixMode;

/// Longest published name (model APIs accept 64 characters).
const MAX_NAME: usize = 64;

/// Returns the catalog name of `tool` from `server`: `<server>_<tool>` (or the tool's own
/// name without a prefix), with characters model APIs reject replaced by `_`, and, when
/// longer than 64 characters, shortened deterministically: the first 55 characters, `_`,
/// and 8 hex digits of a hash of the full name, so that distinct long names stay distinct.
pub fn publish_name(prefix: PrefixMode, server: &str, tool: &str) -> String {
    let full = match prefix {
        PrefixMode::Always => format!("{server}_{tool}"),
        PrefixMode::None => tool.to_owned(),
    };
    let clean: String = full
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect();
    if clean.len() <= MAX_NAME && !clean.is_empty() {
        return clean;
    }
    let head: String = clean.chars().take(MAX_NAME - 9).collect();
    format!("{head}_{:08x}", fnv1a(full.as_bytes()) as u32)
}

/// FNV-1a: stable across runs and platforms, unlike the standard library's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use toolmesh_core::validate_tool_name;

    use super::*;

    #[test]
    fn names_are_prefixed_and_valid() {
        assert_eq!(publish_name(PrefixMode::Always, "everything", "get-sum"), "everything_get-sum");
        assert_eq!(publish_name(PrefixMode::None, "everything", "get-sum"), "get-sum");
        assert_eq!(publish_name(PrefixMode::Always, "fs", "read.file/v2"), "fs_read_file_v2");
    }

    #[test]
    fn long_names_are_shortened_deterministically_and_stay_distinct() {
        let a = publish_name(PrefixMode::Always, "server", &"x".repeat(80));
        let b = publish_name(PrefixMode::Always, "server", &format!("{}y", "x".repeat(79)));
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert_eq!(a, publish_name(PrefixMode::Always, "server", &"x".repeat(80)));
        assert!(validate_tool_name(&a).is_ok() && validate_tool_name(&b).is_ok());
    }
}
