#!/usr/bin/env python3
"""Independent RMCP+ test vectors for cipher suites 3 and 17 (IPMI v2.0 section 13.31-13.32).

Written from the specification with nothing but the standard library (hmac, hashlib), so the
Rust implementation in agent/bmc/src/ipmi/crypto.rs is checked against a second, separate
reading of the spec. Suite 17 cannot be tested live here (no simulator offers it).

    python3 agent/bmc/tests/vectors/ipmi_vectors.py > agent/bmc/tests/vectors/ipmi_vectors.json

Definitions used (SIDm = console session id, SIDc = BMC session id, both little-endian as on
the wire; Rm/Rc = console/BMC random numbers; ROLEm = whole RAKP1 role byte):
    Kuid  = password padded with NULs to 20 bytes
    RAKP2 = HMAC_Kuid(SIDm | SIDc | Rm | Rc | GUIDc | ROLEm | ULENGTHm | UNAMEm)
    RAKP3 = HMAC_Kuid(Rc | SIDm | ROLEm | ULENGTHm | UNAMEm)
    SIK   = HMAC_Kuid(Rm | Rc | ROLEm | ULENGTHm | UNAMEm)          (no Kg configured)
    RAKP4 = HMAC_SIK(Rm | SIDc | GUIDc) truncated to 12 (SHA1) / 16 (SHA256) bytes
    K1    = HMAC_SIK(0x01 * 20), K2 = HMAC_SIK(0x02 * 20), AES key = K2[:16]
    packet AuthCode = HMAC_K1(AuthType .. NextHeader) truncated to 12 / 16 bytes
"""
import hashlib
import hmac
import json
import struct
import sys

SUITES = {
    3: {"hash": hashlib.sha1, "trunc": 12},
    17: {"hash": hashlib.sha256, "trunc": 16},
}

CASES = [
    {
        "name": "admin",
        "username": b"admin",
        "password": b"password",
        "console_sid": 0xA0A1A2A3,
        "bmc_sid": 0x00000002,
        "rm": bytes(range(0x10, 0x20)),
        "rc": bytes(range(0xE0, 0xF0)),
        "guid": bytes.fromhex("a123456789abcdefa123456789abcdef"),
        "role": 0x14,
    },
    {
        "name": "null user, 20-byte password, username/privilege lookup",
        "username": b"",
        "password": b"01234567890123456789",
        "console_sid": 0x00000001,
        "bmc_sid": 0xFFFFFFFE,
        "rm": bytes([0xFF] * 16),
        "rc": bytes([0x00] * 16),
        "guid": bytes(range(16)),
        "role": 0x04,
    },
]


def mac(suite, key, data):
    return hmac.new(key, data, SUITES[suite]["hash"]).digest()


def le32(v):
    return struct.pack("<I", v)


def rmcp_plus_packet(suite, k1, session_id, seq, payload):
    """An authenticated, unencrypted RMCP+ IPMI packet: header, payload, trailer, AuthCode."""
    rmcp = bytes([0x06, 0x00, 0xFF, 0x07])
    header = bytes([0x06, 0x40]) + le32(session_id) + le32(seq) + struct.pack("<H", len(payload))
    signed = header + payload
    pad = (4 - (len(signed) + 2) % 4) % 4
    signed += b"\xff" * pad + bytes([pad, 0x07])
    code = mac(suite, k1, signed)[: SUITES[suite]["trunc"]]
    return rmcp + signed + code


def vector(suite, case):
    kuid = case["password"].ljust(20, b"\x00")
    uname = case["username"]
    ulen = bytes([len(uname)])
    role = bytes([case["role"]])
    sidm, sidc = le32(case["console_sid"]), le32(case["bmc_sid"])
    rm, rc, guid = case["rm"], case["rc"], case["guid"]
    rakp2 = mac(suite, kuid, sidm + sidc + rm + rc + guid + role + ulen + uname)
    rakp3 = mac(suite, kuid, rc + sidm + role + ulen + uname)
    sik = mac(suite, kuid, rm + rc + role + ulen + uname)
    rakp4 = mac(suite, sik, rm + sidc + guid)[: SUITES[suite]["trunc"]]
    k1 = mac(suite, sik, b"\x01" * 20)
    k2 = mac(suite, sik, b"\x02" * 20)
    # Get Chassis Status request message: rsAddr, netFn/LUN, chk, rqAddr, rqSeq, cmd, chk.
    payload = bytes([0x20, 0x00, 0xE0, 0x81, 0x04, 0x01, 0x7A])
    packets = [
        {"seq": seq, "payload": payload[:n].hex(), "packet": rmcp_plus_packet(suite, k1, case["bmc_sid"], seq, payload[:n]).hex()}
        for seq, n in [(1, 7), (2, 6), (3, 5), (4, 4)]
    ]
    return {
        "suite": suite,
        "case": case["name"],
        "username": uname.decode(),
        "password": case["password"].decode(),
        "console_session_id": case["console_sid"],
        "bmc_session_id": case["bmc_sid"],
        "console_random": rm.hex(),
        "bmc_random": rc.hex(),
        "bmc_guid": guid.hex(),
        "role": case["role"],
        "rakp2_auth_code": rakp2.hex(),
        "rakp3_auth_code": rakp3.hex(),
        "sik": sik.hex(),
        "rakp4_integrity_check": rakp4.hex(),
        "k1": k1.hex(),
        "k2": k2.hex(),
        "aes_key": k2[:16].hex(),
        "packets": packets,
    }


def main():
    # Self-check of the HMAC primitive against RFC 4231 test case 2 before trusting it.
    assert hmac.new(b"Jefe", b"what do ya want for nothing?", hashlib.sha256).hexdigest() == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )
    vectors = [vector(suite, case) for suite in (17, 3) for case in CASES]
    json.dump({"generator": "agent/bmc/tests/vectors/ipmi_vectors.py", "vectors": vectors}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
