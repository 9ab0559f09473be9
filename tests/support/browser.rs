//! Debian's Chromium, headless, driven through chromedriver (WebDriver, with fantoccini): one
//! browser per test, on a port and a profile of its own, so tests run in parallel.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless Chromium; the driver process is killed when dropped.
pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: PathBuf,
}

impl Browser {
    pub async fn start() -> Self {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(program).exists(),
                "{program} is missing: run scripts/services-up (it installs Debian's chromium and \
                 chromium-driver)"
            );
        }
        // fantoccini's client is built on rustls, which needs a process-wide provider (it speaks
        // plain HTTP to chromedriver, but builds its TLS connector all the same).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // A process group of its own, so the browsers it starts go with it (see `drop`).
        let driver = Command::new(CHROMEDRIVER)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile =
            std::env::temp_dir().join(format!("outbox-chromium-{}", uuid::Uuid::new_v4()));
        // The flags keep Chromium off the network it would call at start (this machine's is
        // closed), and fit it to a container (no sandbox as root, no GPU, a small /dev/shm).
        let options = serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-quic", "--no-first-run", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ],
        });
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{port}");
        let mut last_error = None;
        for _ in 0..100 {
            match ClientBuilder::rustls()
                .expect("rustls loads")
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => return Browser { client, driver, profile },
                Err(error) => last_error = Some(error),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver on port {port} gave no session in 10 s: {last_error:?}");
    }

    /// Saves a screenshot of the page as `target/console-screenshots/NAME.png`, for a reviewer.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

impl Browser {
    /// Ends the session: Chromium exits.
    pub async fn close(&self) {
        self.client.clone().close().await.unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: killing chromedriver alone would leave a failed test's Chromium.
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
