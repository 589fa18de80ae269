//! RMCP+ cryptography for cipher suites 3 and 17 (IPMI v2.0 §13.28-13.32), without I/O.
//!
//! | suite | authentication     | integrity        | confidentiality |
//! |-------|--------------------|------------------|-----------------|
//! | 3     | RAKP-HMAC-SHA1     | HMAC-SHA1-96     | AES-CBC-128     |
//! | 17    | RAKP-HMAC-SHA256   | HMAC-SHA256-128  | AES-CBC-128     |
//!
//! Key derivation: `Kuid` = password padded with zeros to 20 bytes; `SIK = HMAC_Kg(Rm|Rc|ROLEm|
//! ULENGTHm|UNAMEm)` with `Kg = Kuid` when no BMC key is set; `K1 = HMAC_SIK(0x01 x 20)`,
//! `K2 = HMAC_SIK(0x02 x 20)` (20-byte constants for both suites, as deployed BMCs and
//! ipmitool use); the AES key is the first 16 bytes of `K2`.

use aes::Aes128;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::NoPadding};
use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::Sha256;
use zeroize::Zeroizing;

use super::wire::DecodeError;

/// Longest IPMI v2.0 password (bytes).
pub const MAX_PASSWORD_LEN: usize = 20;
/// Longest IPMI user name (bytes).
pub const MAX_USERNAME_LEN: usize = 16;
/// AES block size and IV length.
pub const AES_BLOCK: usize = 16;

/// A cipher suite this client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CipherSuite {
    /// Suite 3: RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128.
    Suite3,
    /// Suite 17: RAKP-HMAC-SHA256, HMAC-SHA256-128, AES-CBC-128.
    Suite17,
}

impl CipherSuite {
    /// Every suite, in order of preference.
    pub const PREFERRED: [Self; 2] = [Self::Suite17, Self::Suite3];

    /// The cipher suite ID of the specification.
    pub fn id(self) -> u8 {
        match self {
            Self::Suite3 => 3,
            Self::Suite17 => 17,
        }
    }

    /// The suite with this ID, when supported.
    pub fn from_id(id: u8) -> Option<Self> {
        match id {
            3 => Some(Self::Suite3),
            17 => Some(Self::Suite17),
            _ => None,
        }
    }

    /// Authentication algorithm number (RAKP-HMAC-SHA1 = 1, RAKP-HMAC-SHA256 = 3).
    pub fn auth_algorithm(self) -> u8 {
        match self {
            Self::Suite3 => 0x01,
            Self::Suite17 => 0x03,
        }
    }

    /// Integrity algorithm number (HMAC-SHA1-96 = 1, HMAC-SHA256-128 = 4).
    pub fn integrity_algorithm(self) -> u8 {
        match self {
            Self::Suite3 => 0x01,
            Self::Suite17 => 0x04,
        }
    }

    /// Confidentiality algorithm number (AES-CBC-128 = 1).
    pub fn confidentiality_algorithm(self) -> u8 {
        0x01
    }

    /// Length of the RAKP2/RAKP3 key-exchange auth codes (full HMAC).
    pub fn auth_code_len(self) -> usize {
        match self {
            Self::Suite3 => 20,
            Self::Suite17 => 32,
        }
    }

    /// Length of the RAKP4 integrity check value and of packet auth codes (truncated HMAC).
    pub fn integrity_len(self) -> usize {
        match self {
            Self::Suite3 => 12,
            Self::Suite17 => 16,
        }
    }

    /// HMAC with this suite's hash.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            // HMAC accepts keys of any length, so this never fails.
            let Ok(mut mac) = <M as hmac::digest::KeyInit>::new_from_slice(key) else {
                return Vec::new();
            };
            for p in parts {
                mac.update(p);
            }
            mac.finalize().into_bytes().to_vec()
        }
        Zeroizing::new(match self {
            Self::Suite3 => run::<Hmac<Sha1>>(key, parts),
            Self::Suite17 => run::<Hmac<Sha256>>(key, parts),
        })
    }
}

/// Everything both sides of a RAKP exchange know, the inputs of every auth code.
#[derive(Debug, Clone)]
pub struct RakpContext<'a> {
    /// Our (remote console) session ID, `SIDm`.
    pub console_session_id: u32,
    /// The BMC's (managed system) session ID, `SIDc`.
    pub bmc_session_id: u32,
    /// Our random number, `Rm`.
    pub console_random: [u8; 16],
    /// The BMC's random number, `Rc`.
    pub bmc_random: [u8; 16],
    /// The BMC's GUID, `GUIDc`.
    pub bmc_guid: [u8; 16],
    /// The whole requested-role byte of RAKP1, `ROLEm`.
    pub role: u8,
    /// The user name, `UNAMEm`.
    pub username: &'a [u8],
}

/// Pads a password to the 20-byte `Kuid`; `None` when it is longer than 20 bytes.
pub fn user_key(password: &[u8]) -> Option<Zeroizing<[u8; MAX_PASSWORD_LEN]>> {
    if password.len() > MAX_PASSWORD_LEN {
        return None;
    }
    let mut key = Zeroizing::new([0u8; MAX_PASSWORD_LEN]);
    key[..password.len()].copy_from_slice(password);
    Some(key)
}

fn username_len(ctx: &RakpContext<'_>) -> [u8; 1] {
    // Callers validate names against MAX_USERNAME_LEN before building a context.
    [ctx.username.len() as u8]
}

/// The key-exchange auth code the BMC must send in RAKP2.
pub fn rakp2_auth_code(
    suite: CipherSuite,
    kuid: &[u8],
    ctx: &RakpContext<'_>,
) -> Zeroizing<Vec<u8>> {
    suite.hmac(
        kuid,
        &[
            &ctx.console_session_id.to_le_bytes(),
            &ctx.bmc_session_id.to_le_bytes(),
            &ctx.console_random,
            &ctx.bmc_random,
            &ctx.bmc_guid,
            &[ctx.role],
            &username_len(ctx),
            ctx.username,
        ],
    )
}

/// The key-exchange auth code we send in RAKP3.
pub fn rakp3_auth_code(
    suite: CipherSuite,
    kuid: &[u8],
    ctx: &RakpContext<'_>,
) -> Zeroizing<Vec<u8>> {
    suite.hmac(
        kuid,
        &[
            &ctx.bmc_random,
            &ctx.console_session_id.to_le_bytes(),
            &[ctx.role],
            &username_len(ctx),
            ctx.username,
        ],
    )
}

/// The session integrity key; `kg` is the BMC key, or `Kuid` when none is configured.
pub fn session_integrity_key(
    suite: CipherSuite,
    kg: &[u8],
    ctx: &RakpContext<'_>,
) -> Zeroizing<Vec<u8>> {
    suite.hmac(
        kg,
        &[
            &ctx.console_random,
            &ctx.bmc_random,
            &[ctx.role],
            &username_len(ctx),
            ctx.username,
        ],
    )
}

/// The integrity check value the BMC must send in RAKP4 (truncated).
pub fn rakp4_integrity_check(
    suite: CipherSuite,
    sik: &[u8],
    ctx: &RakpContext<'_>,
) -> Zeroizing<Vec<u8>> {
    let mut icv = suite.hmac(
        sik,
        &[
            &ctx.console_random,
            &ctx.bmc_session_id.to_le_bytes(),
            &ctx.bmc_guid,
        ],
    );
    icv.truncate(suite.integrity_len());
    icv
}

/// The keys of an active session.
#[derive(Clone)]
pub struct SessionKeys {
    /// The negotiated suite.
    pub suite: CipherSuite,
    /// Integrity key `K1`.
    pub k1: Zeroizing<Vec<u8>>,
    /// AES-128 key (first 16 bytes of `K2`).
    pub aes_key: Zeroizing<[u8; 16]>,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionKeys")
            .field("suite", &self.suite)
            .finish_non_exhaustive()
    }
}

impl SessionKeys {
    /// Derives `K1` and `K2` from the session integrity key.
    pub fn derive(suite: CipherSuite, sik: &[u8]) -> Self {
        let k1 = suite.hmac(sik, &[&[0x01; 20]]);
        let k2 = suite.hmac(sik, &[&[0x02; 20]]);
        let mut aes_key = Zeroizing::new([0u8; 16]);
        for (dst, src) in aes_key.iter_mut().zip(k2.iter()) {
            *dst = *src;
        }
        Self { suite, k1, aes_key }
    }

    /// The `K2` prefix used as AES key (for test vectors).
    pub fn aes_key(&self) -> &[u8; 16] {
        &self.aes_key
    }

    /// The truncated integrity auth code over `signed` (auth type through next header).
    pub fn packet_auth_code(&self, signed: &[u8]) -> Zeroizing<Vec<u8>> {
        let mut code = self.suite.hmac(&self.k1, &[signed]);
        code.truncate(self.suite.integrity_len());
        code
    }

    /// Checks a received packet's auth code in constant time.
    pub fn verify_packet(&self, signed: &[u8], auth_code: &[u8]) -> bool {
        constant_time_eq(&self.packet_auth_code(signed), auth_code)
    }

    /// Encrypts an IPMI payload: IV, then AES-CBC-128 of data + pad 1,2,3.. + pad length.
    pub fn encrypt(&self, iv: [u8; AES_BLOCK], plain: &[u8]) -> Vec<u8> {
        encrypt_aes_cbc_128(&self.aes_key, iv, plain)
    }

    /// Decrypts an IPMI payload and strips the confidentiality pad.
    pub fn decrypt(&self, payload: &[u8]) -> Result<Vec<u8>, DecodeError> {
        decrypt_aes_cbc_128(&self.aes_key, payload)
    }
}

/// Compares two byte strings without an early exit on the first difference.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// AES-CBC-128 with the IPMI confidentiality pad; returns IV || ciphertext.
pub fn encrypt_aes_cbc_128(key: &[u8; 16], iv: [u8; AES_BLOCK], plain: &[u8]) -> Vec<u8> {
    let pad = (AES_BLOCK - (plain.len() + 1) % AES_BLOCK) % AES_BLOCK;
    let mut buf = Vec::with_capacity(AES_BLOCK + plain.len() + pad + 1);
    buf.extend_from_slice(&iv);
    buf.extend_from_slice(plain);
    buf.extend((1..=pad).map(|i| i as u8));
    buf.push(pad as u8);
    let body_len = buf.len() - AES_BLOCK;
    let enc = cbc::Encryptor::<Aes128>::new(key.into(), &iv.into());
    // The body is a whole number of blocks by construction, so NoPadding cannot fail.
    let _ = enc.encrypt_padded_mut::<NoPadding>(&mut buf[AES_BLOCK..], body_len);
    buf
}

/// Inverse of [`encrypt_aes_cbc_128`]: checks the block structure and the pad.
pub fn decrypt_aes_cbc_128(key: &[u8; 16], payload: &[u8]) -> Result<Vec<u8>, DecodeError> {
    if payload.len() < 2 * AES_BLOCK || !payload.len().is_multiple_of(AES_BLOCK) {
        return Err(DecodeError::LengthMismatch {
            what: "aes-cbc-128 payload",
            declared: payload.len(),
            available: payload.len() - payload.len() % AES_BLOCK,
        });
    }
    let mut iv = [0u8; AES_BLOCK];
    iv.copy_from_slice(&payload[..AES_BLOCK]);
    let mut body = payload[AES_BLOCK..].to_vec();
    let dec = cbc::Decryptor::<Aes128>::new(key.into(), &iv.into());
    let plain_len = dec
        .decrypt_padded_mut::<NoPadding>(&mut body)
        .map_err(|_| DecodeError::BadConfidentialityPad)?
        .len();
    let last = plain_len
        .checked_sub(1)
        .ok_or(DecodeError::BadConfidentialityPad)?;
    let pad = usize::from(body[last]);
    if pad >= AES_BLOCK || pad > last {
        return Err(DecodeError::BadConfidentialityPad);
    }
    let data_len = last - pad;
    if body[data_len..last]
        .iter()
        .enumerate()
        .any(|(i, b)| usize::from(*b) != i + 1)
    {
        return Err(DecodeError::BadConfidentialityPad);
    }
    body.truncate(data_len);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn aes_matches_nist_sp800_38a_cbc_aes128_first_block() {
        // NIST SP 800-38A F.2.1 CBC-AES128.Encrypt, block 1.
        let key: [u8; 16] = hex("2b7e151628aed2a6abf7158809cf4f3c").try_into().unwrap();
        let iv: [u8; 16] = hex("000102030405060708090a0b0c0d0e0f").try_into().unwrap();
        let plain = hex("6bc1bee22e409f96e93d7e117393172a");
        // 16 data bytes + 15 pad bytes + pad length = 2 blocks; the first is the NIST block.
        let out = encrypt_aes_cbc_128(&key, iv, &plain);
        assert_eq!(&out[..16], &iv);
        assert_eq!(&out[16..32], &hex("7649abac8119b246cee98e9b12e9197d")[..]);
        assert_eq!(out.len(), 48);
        assert_eq!(decrypt_aes_cbc_128(&key, &out).unwrap(), plain);
    }

    #[test]
    fn aes_round_trips_every_length_and_rejects_bad_pads() {
        let key = [7u8; 16];
        for len in 0..40 {
            let plain: Vec<u8> = (0..len).map(|i: u8| i.wrapping_mul(7)).collect();
            let out = encrypt_aes_cbc_128(&key, [3; 16], &plain);
            assert_eq!(out.len() % 16, 0);
            assert_eq!(decrypt_aes_cbc_128(&key, &out).unwrap(), plain);
        }
        assert!(decrypt_aes_cbc_128(&key, &[0; 17]).is_err());
        assert!(decrypt_aes_cbc_128(&key, &[0; 16]).is_err());
    }

    #[test]
    fn hmac_sha1_matches_rfc2202_case_2() {
        let mac = CipherSuite::Suite3.hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            &mac[..],
            &hex("effcdf6ae5eb2fa2d27416d5f184df9c259a7c79")[..]
        );
    }

    #[test]
    fn hmac_sha256_matches_rfc4231_case_2() {
        let mac = CipherSuite::Suite17.hmac(b"Jefe", &[b"what do ya want for nothing?"]);
        assert_eq!(
            &mac[..],
            &hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")[..]
        );
    }

    #[test]
    fn user_key_pads_and_refuses_long_passwords() {
        assert_eq!(&user_key(b"ab").unwrap()[..3], b"ab\0");
        assert!(user_key(&[b'x'; 20]).is_some());
        assert!(user_key(&[b'x'; 21]).is_none());
    }
}
