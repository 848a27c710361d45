//! Which destinations an HTTP tool may reach without `allow_private_network`: the IANA
//! special-purpose address registries for IPv4 and IPv6 (as of RFC 9780), decided by the
//! most specific entry, where only an entry marked globally reachable is allowed. IPv6
//! addresses outside the global unicast space (2000::/3) that no entry names are refused
//! too: they are reserved, among them the deprecated IPv4-compatible `::a.b.c.d`. Addresses
//! that carry an IPv4 address (IPv4-mapped, NAT64, 6to4) are judged by that address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How a registry entry's addresses are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Globally reachable: allowed.
    Global,
    /// Not globally reachable (private, loopback, documentation, benchmarking, reserved…):
    /// refused.
    Local,
    /// Carries an IPv4 address in the given bits (from the most significant): judged by it.
    Embeds { shift: u32 },
}

use Reach::{Embeds, Global, Local};

/// IANA IPv4 Special-Purpose Address Registry, plus multicast (224.0.0.0/4, not unicast).
const IPV4: &[(u32, u8, Reach, &str)] = &[
    (0x0000_0000, 8, Local, "this network (RFC 791)"),
    (0x0a00_0000, 8, Local, "private use (RFC 1918)"),
    (0x6440_0000, 10, Local, "shared address space (RFC 6598)"),
    (0x7f00_0000, 8, Local, "loopback (RFC 1122)"),
    (0xa9fe_0000, 16, Local, "link local (RFC 3927)"),
    (0xac10_0000, 12, Local, "private use (RFC 1918)"),
    (0xc000_0000, 24, Local, "IETF protocol assignments (RFC 6890)"),
    (0xc000_0000, 29, Local, "IPv4 service continuity prefix (RFC 7335)"),
    (0xc000_0008, 32, Local, "IPv4 dummy address (RFC 7600)"),
    (0xc000_0009, 32, Global, "port control protocol anycast (RFC 7723)"),
    (0xc000_000a, 32, Global, "TURN anycast (RFC 8155)"),
    (0xc000_00aa, 32, Local, "NAT64/DNS64 discovery (RFC 8880)"),
    (0xc000_00ab, 32, Local, "NAT64/DNS64 discovery (RFC 8880)"),
    (0xc000_0200, 24, Local, "documentation, TEST-NET-1 (RFC 5737)"),
    (0xc01f_c400, 24, Global, "AS112-v4 (RFC 7535)"),
    (0xc034_c100, 24, Global, "AMT (RFC 7450)"),
    (0xc058_6300, 24, Local, "deprecated 6to4 relay anycast (RFC 7526)"),
    (0xc0a8_0000, 16, Local, "private use (RFC 1918)"),
    (0xc0af_3000, 24, Global, "direct delegation AS112 service (RFC 7534)"),
    (0xc612_0000, 15, Local, "benchmarking (RFC 2544)"),
    (0xc633_6400, 24, Local, "documentation, TEST-NET-2 (RFC 5737)"),
    (0xcb00_7100, 24, Local, "documentation, TEST-NET-3 (RFC 5737)"),
    (0xe000_0000, 4, Local, "multicast (RFC 5771)"),
    (0xf000_0000, 4, Local, "reserved (RFC 1112)"),
    (0xffff_ffff, 32, Local, "limited broadcast (RFC 8190)"),
];

/// IANA IPv6 Special-Purpose Address Registry, plus multicast (ff00::/8).
const IPV6: &[(u128, u8, Reach, &str)] = &[
    (0x0000_0000_0000_0000_0000_0000_0000_0001, 128, Local, "loopback (RFC 4291)"),
    (0x0000_0000_0000_0000_0000_0000_0000_0000, 128, Local, "unspecified (RFC 4291)"),
    (0x0000_0000_0000_0000_0000_ffff_0000_0000, 96, Embeds { shift: 0 }, "IPv4-mapped (RFC 4291)"),
    (
        0x0064_ff9b_0000_0000_0000_0000_0000_0000,
        96,
        Embeds { shift: 0 },
        "IPv4-IPv6 translation (RFC 6052)",
    ),
    (
        0x0064_ff9b_0001_0000_0000_0000_0000_0000,
        48,
        Local,
        "local-use IPv4/IPv6 translation (RFC 8215)",
    ),
    (0x0100_0000_0000_0000_0000_0000_0000_0000, 64, Local, "discard-only (RFC 6666)"),
    (0x0100_0000_0000_0001_0000_0000_0000_0000, 64, Local, "dummy IPv6 prefix (RFC 9780)"),
    (0x2001_0000_0000_0000_0000_0000_0000_0000, 23, Local, "IETF protocol assignments (RFC 2928)"),
    (0x2001_0000_0000_0000_0000_0000_0000_0000, 32, Local, "TEREDO (RFC 4380)"),
    (
        0x2001_0001_0000_0000_0000_0000_0000_0001,
        128,
        Global,
        "port control protocol anycast (RFC 7723)",
    ),
    (0x2001_0001_0000_0000_0000_0000_0000_0002, 128, Global, "TURN anycast (RFC 8155)"),
    (0x2001_0001_0000_0000_0000_0000_0000_0003, 128, Global, "DNS-SD SRP anycast (RFC 9665)"),
    (0x2001_0002_0000_0000_0000_0000_0000_0000, 48, Local, "benchmarking (RFC 5180)"),
    (0x2001_0003_0000_0000_0000_0000_0000_0000, 32, Global, "AMT (RFC 7450)"),
    (0x2001_0004_0112_0000_0000_0000_0000_0000, 48, Global, "AS112-v6 (RFC 7535)"),
    (0x2001_0010_0000_0000_0000_0000_0000_0000, 28, Local, "deprecated ORCHID (RFC 4843)"),
    (0x2001_0020_0000_0000_0000_0000_0000_0000, 28, Global, "ORCHIDv2 (RFC 7343)"),
    (0x2001_0030_0000_0000_0000_0000_0000_0000, 28, Global, "drone remote ID (RFC 9374)"),
    (0x2001_0db8_0000_0000_0000_0000_0000_0000, 32, Local, "documentation (RFC 3849)"),
    (0x2002_0000_0000_0000_0000_0000_0000_0000, 16, Embeds { shift: 80 }, "6to4 (RFC 3056)"),
    (
        0x2620_004f_8000_0000_0000_0000_0000_0000,
        48,
        Global,
        "direct delegation AS112 service (RFC 7534)",
    ),
    (0x3fff_0000_0000_0000_0000_0000_0000_0000, 20, Local, "documentation (RFC 9637)"),
    (0x5f00_0000_0000_0000_0000_0000_0000_0000, 16, Local, "segment routing SIDs (RFC 9602)"),
    (0xfc00_0000_0000_0000_0000_0000_0000_0000, 7, Local, "unique local (RFC 4193)"),
    (0xfe80_0000_0000_0000_0000_0000_0000_0000, 10, Local, "link-local unicast (RFC 4291)"),
    (0xff00_0000_0000_0000_0000_0000_0000_0000, 8, Local, "multicast (RFC 4291)"),
];

/// Returns the reach and name of the most specific entry that holds `address`, an address
/// of `bits` bits; entries are given as (network, prefix length, reach, name).
fn most_specific(
    entries: impl Iterator<Item = (u128, u8, Reach, &'static str)>,
    address: u128,
    bits: u32,
) -> Option<(Reach, &'static str)> {
    entries
        .filter(|(net, len, ..)| {
            let shift = bits - u32::from(*len);
            *len == 0 || (address >> shift) == (*net >> shift)
        })
        .max_by_key(|(_, len, ..)| *len)
        .map(|(_, _, reach, name)| (reach, name))
}

/// Returns why `ip` may not be reached without `allow_private_network` (the registry entry
/// that holds it), or `None` for a globally reachable address.
pub(crate) fn special_purpose(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => v4(ip),
        IpAddr::V6(ip) => v6(ip),
    }
}

fn v4(ip: Ipv4Addr) -> Option<&'static str> {
    let entries =
        IPV4.iter().map(|(net, len, reach, name)| (u128::from(*net), *len, *reach, *name));
    match most_specific(entries, u128::from(u32::from(ip)), 32) {
        Some((Local | Embeds { .. }, name)) => Some(name),
        Some((Global, _)) | None => None,
    }
}

fn v6(ip: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(ip);
    match most_specific(IPV6.iter().copied(), bits, 128) {
        Some((Local, name)) => Some(name),
        Some((Global, _)) => None,
        Some((Embeds { shift }, _)) => v4(Ipv4Addr::from((bits >> shift) as u32)),
        // Outside the global unicast space and named by no entry: reserved by the IETF.
        None if bits >> 125 != 0b001 => Some("reserved (RFC 4291), outside global unicast"),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One address from each registry entry (its first, and where an entry holds a more
    /// specific one, an address outside that), written out by hand, and whether it is
    /// refused.
    #[test]
    fn every_registry_entry_is_judged_as_the_registry_says() {
        let cases: &[(&str, bool)] = &[
            ("0.0.0.0", true),
            ("0.255.255.255", true),
            ("10.1.2.3", true),
            ("100.64.0.1", true),
            ("100.127.255.255", true),
            ("127.0.0.1", true),
            ("169.254.169.254", true),
            ("172.16.0.1", true),
            ("172.31.255.255", true),
            ("192.0.0.100", true),
            ("192.0.0.1", true),
            ("192.0.0.8", true),
            ("192.0.0.9", false),
            ("192.0.0.10", false),
            ("192.0.0.170", true),
            ("192.0.0.171", true),
            ("192.0.2.1", true),
            ("192.31.196.1", false),
            ("192.52.193.1", false),
            ("192.88.99.1", true),
            ("192.168.1.1", true),
            ("192.175.48.1", false),
            ("198.18.0.1", true),
            ("198.19.255.255", true),
            ("198.51.100.7", true),
            ("203.0.113.9", true),
            ("224.0.0.1", true),
            ("239.255.255.255", true),
            ("240.0.0.1", true),
            ("255.255.255.255", true),
            ("8.8.8.8", false),
            ("1.1.1.1", false),
            ("100.128.0.1", false),
            ("172.32.0.1", false),
            ("198.20.0.1", false),
            ("::1", true),
            ("::", true),
            ("::ffff:127.0.0.1", true),
            ("::ffff:10.0.0.1", true),
            ("::ffff:8.8.8.8", false),
            ("64:ff9b::7f00:1", true),
            ("64:ff9b::808:808", false),
            ("64:ff9b:1::1", true),
            ("100::1", true),
            ("100:0:0:1::1", true),
            ("2001:1::4", true),
            ("2001::1", true),
            ("2001:1::1", false),
            ("2001:1::2", false),
            ("2001:1::3", false),
            ("2001:2::1", true),
            ("2001:3::1", false),
            ("2001:4:112::1", false),
            ("2001:10::1", true),
            ("2001:20::1", false),
            ("2001:30::1", false),
            ("2001:db8::1", true),
            ("2002:7f00:1::1", true),
            ("2002:808:808::1", false),
            ("2620:4f:8000::1", false),
            ("3fff::1", true),
            ("5f00::1", true),
            ("fc00::1", true),
            ("fd12:3456::1", true),
            ("fe80::1", true),
            ("ff02::1", true),
            ("::127.0.0.1", true),
            ("::8.8.8.8", true),
            ("4000::1", true),
            ("2606:4700::1111", false),
            ("2a00:1450:4001::200e", false),
        ];
        for (address, refused) in cases {
            let ip: IpAddr = address.parse().unwrap();
            assert_eq!(
                special_purpose(ip).is_some(),
                *refused,
                "{address}: {:?}",
                special_purpose(ip)
            );
        }
    }
}
