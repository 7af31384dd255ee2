//! One word per concept in the kernel section: the capability table's word (native, fallback,
//! unsupported) is the word every other table and the verdict use for a format on a card.
//!
//! Results written before this module said "unsupported on this card" in the W4A4 skip reason on
//! sm_80–sm_90, where the capability table says "fallback" (engines run W4A4 NVFP4 checkpoints
//! through the W4A16 path there). [`skip_reason`] shows such stored reasons with the capability
//! table's word, so a re-rendered report uses one word too; the stored text is not changed.

use crate::rig::{Capability, Support};

/// The prefix of the W4A4 skip reason in results written before the wording was unified.
const LEGACY_W4A4_PREFIX: &str = "unsupported on this card: ";

/// The skip reason to display for `implementation`, given the card's capability table.
///
/// A W4A4 reason stored with the legacy prefix is shown with the word the capability table gives
/// W4A4 on this card (`fallback` on sm_80–sm_90). Any other reason is returned unchanged.
pub fn skip_reason(implementation: &str, reason: &str, capabilities: &[Capability]) -> String {
    if implementation != "w4a4" {
        return reason.to_string();
    }
    let Some(rest) = reason.strip_prefix(LEGACY_W4A4_PREFIX) else {
        return reason.to_string();
    };
    match capabilities
        .iter()
        .find(|c| c.format == crate::formats::GemmFormat::W4a4)
        .map(|c| c.support)
    {
        Some(Support::Fallback) => format!("fallback on this card (native W4A4 not timed): {rest}"),
        Some(s) => format!("{s} on this card: {rest}"),
        None => reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_w4a4_reason_takes_the_capability_word() {
        let caps = crate::rig::capability::table("sm_90".parse().unwrap());
        let old = "unsupported on this card: sm_90 has no FP4 tensor cores (they start at sm_100)";
        let shown = skip_reason("w4a4", old, &caps);
        assert!(shown.starts_with("fallback on this card"), "{shown}");
        assert!(!shown.contains("unsupported"), "{shown}");
        assert!(shown.contains("sm_90 has no FP4 tensor cores"));
        // Other implementations and new reasons are left alone.
        assert_eq!(skip_reason("w4a16", old, &caps), old);
        assert_eq!(skip_reason("w4a4", "K = 48", &caps), "K = 48");
        // Without a capability table nothing is guessed.
        assert_eq!(skip_reason("w4a4", old, &[]), old);
    }
}
