//! Certificates a test makes for itself with the `openssl` command (which every machine with
//! Debian's PostgreSQL has: `ssl-cert` depends on it): a CA, and a server certificate it signed
//! for `127.0.0.1` and `localhost`, in a temporary directory of their own, removed when dropped.
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    pub fn generate() -> Certs {
        let dir = std::env::temp_dir().join(format!("outbox-certs-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).unwrap();
        let certs = Certs { dir };
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        certs.openssl(&format!(
            "req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=outbox-test-ca"
        ));
        certs.openssl(&format!("req {ec} -keyout server.key -out server.csr -subj /CN=127.0.0.1"));
        std::fs::write(
            certs.dir.join("server.ext"),
            "subjectAltName = IP:127.0.0.1, DNS:localhost\nbasicConstraints = CA:FALSE\n\
             keyUsage = digitalSignature\nextendedKeyUsage = serverAuth\n",
        )
        .unwrap();
        certs.openssl(
            "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
             -days 2 -extfile server.ext",
        );
        certs
    }

    /// The CA's certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The server's certificate (PEM), for 127.0.0.1 and localhost.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }

    /// The server's private key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `openssl` with `args` (split on spaces) in the directory; panics with its stderr.
    fn openssl(&self, args: &str) {
        let output = Command::new("openssl")
            .args(args.split(' '))
            .current_dir(&self.dir)
            .output()
            .expect("the openssl command runs (Debian package openssl)");
        assert!(
            output.status.success(),
            "openssl {args}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
