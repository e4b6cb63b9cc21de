//! The web dashboard in a real browser: Debian's Chromium, headless, driven
//! over WebDriver (chromedriver) with `fantoccini`, against real servers.
//! The page must show a lock a test takes, drop it when it is released, and
//! on a 3-node cluster show the new leader after the leader is killed.
//!
//! Needs `chromedriver` and `chromium` (`scripts/chromium.sh` installs
//! Debian's packages, as `scripts/test.sh` does): without them these tests
//! fail, never skip.

mod common;

use common::{deadbolt, start_cluster, TestServer};
use fantoccini::{Client, ClientBuilder, Locator};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One browser at a time: two cores, and a cluster test beside it.
static ONE_BROWSER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the page may take to show a change (it polls every second).
const SHOWN_WITHIN: Duration = Duration::from_secs(20);

/// `name` on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// chromedriver on its own port, and a headless Chromium session through it.
struct Browser {
    driver: Child,
    client: Client,
}

impl Browser {
    async fn start() -> Browser {
        let driver_path = std::env::var_os("DEADBOLT_CHROMEDRIVER")
            .map(PathBuf::from)
            .or_else(|| on_path("chromedriver"))
            .expect("chromedriver not found: run scripts/chromium.sh (as root it installs Debian's chromium and chromium-driver)");
        let chromium = on_path("chromium").expect(
            "chromium not found: run scripts/chromium.sh (as root it installs Debian's chromium)",
        );
        let port = common::free_port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                // As root (CI) Chromium needs --no-sandbox.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session through chromedriver");
        Browser { driver, client }
    }

    /// The text of the first element matching `css`, or "" if none.
    async fn text(&self, css: &str) -> String {
        match self.client.find(Locator::Css(css)).await {
            Ok(element) => element.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Waits until `check` holds for the text of `css`.
    async fn wait_text(&self, css: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
        match self.shows(css, &check).await {
            Ok(text) => text,
            Err(text) => {
                let page = self.text("body").await;
                panic!("the page did not show {what} within {SHOWN_WITHIN:?}; {css}: {text:?}; page:\n{page}");
            }
        }
    }

    /// The text of `css` once `check` holds for it, or its last text if
    /// that did not happen within [`SHOWN_WITHIN`].
    async fn shows(&self, css: &str, check: impl Fn(&str) -> bool) -> Result<String, String> {
        let started = Instant::now();
        loop {
            let text = self.text(css).await;
            if check(&text) {
                return Ok(text);
            }
            if started.elapsed() > SHOWN_WITHIN {
                return Err(text);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn acquire(endpoint: &str, lock: &str) -> (String, String) {
    let output = deadbolt(endpoint, &["acquire", "--lock", lock, "--ttl", "1m"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut words = stdout.split_whitespace().map(str::to_owned);
    (words.next().unwrap(), words.next().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_a_lock_while_it_is_held_and_its_history() {
    let _one = ONE_BROWSER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    let browser = Browser::start().await;
    browser
        .client
        .goto(&format!("{endpoint}/ui"))
        .await
        .unwrap();
    browser
        .wait_text("#leader", "the leader", |t| t.starts_with("node 1"))
        .await;
    // A single node without a cluster secret: no peer can authenticate.
    browser
        .wait_text("#peer-auth", "how peers authenticate", |t| t == "none")
        .await;
    browser
        .wait_text("#release", "the release", |t| {
            t == env!("CARGO_PKG_VERSION")
        })
        .await;
    // The single node raises its cluster version by itself.
    let newest = deadbolt_server::FeatureLevel::NEWEST.to_string();
    browser
        .wait_text("#cluster-version", "the cluster version", |t| t == newest)
        .await;

    let (session, token) = acquire(&endpoint, "dash/invoices");
    acquire(&endpoint, "other/reports");
    let row = r#"#locks tr[data-lock="dash/invoices"]"#;
    let shown = browser
        .wait_text(row, "the lock taken", |t| t.contains(&token))
        .await;
    assert!(shown.contains("dash/invoices"), "{shown}");
    // The live events (a watch since the page opened) show both grants.
    let events = browser
        .wait_text("#events", "the grants as events", |t| {
            t.contains("dash/invoices") && t.contains("other/reports")
        })
        .await;
    assert!(
        events.contains("granted") && events.contains(&token),
        "{events}"
    );

    // Searching by prefix keeps only the locks under it.
    browser
        .client
        .find(Locator::Id("prefix"))
        .await
        .unwrap()
        .send_keys("other/")
        .await
        .unwrap();
    browser
        .wait_text(row, "the lock filtered out", str::is_empty)
        .await;
    browser
        .wait_text(
            r#"#locks tr[data-lock="other/reports"]"#,
            "the other lock",
            |t| !t.is_empty(),
        )
        .await;
    browser
        .client
        .find(Locator::Id("prefix"))
        .await
        .unwrap()
        .clear()
        .await
        .unwrap();
    browser
        .client
        .execute(
            "document.getElementById('prefix').dispatchEvent(new Event('input'))",
            vec![],
        )
        .await
        .unwrap();
    browser
        .wait_text(row, "the lock again", |t| t.contains(&token))
        .await;

    // Its history, from the row's button.
    let button = format!("{row} button");
    browser
        .client
        .find(Locator::Css(&button))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait_text("#history", "the grant in the history", |t| {
            t.contains("granted") && t.contains(&token)
        })
        .await;

    let released = deadbolt(
        &endpoint,
        &[
            "release",
            "--lock",
            "dash/invoices",
            "--session",
            &session,
            "--token",
            &token,
        ],
    );
    assert!(released.status.success(), "{released:?}");
    browser
        .wait_text(row, "the lock released", str::is_empty)
        .await;
    browser
        .wait_text("#history", "the release in the history", |t| {
            t.contains("released")
        })
        .await;
    browser
        .wait_text("#rate-text", "the grant rate", |t| t.contains("grants/s"))
        .await;

    // A token given in the page goes with every request it makes from then
    // on (given and watched in one script: no poll falls in between).
    let given = "const box = document.getElementById('token'); box.value = 's3cret'; \
                 box.dispatchEvent(new Event('change')); \
                 window.sent = []; const plain = window.fetch; \
                 window.fetch = (url, options) => { \
                   window.sent.push(options.headers['Authorization'] || ''); \
                   return plain(url, options); };";
    browser.client.execute(given, vec![]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let sent = browser
        .client
        .execute("return window.sent", vec![])
        .await
        .unwrap();
    let sent: Vec<String> = serde_json::from_value(sent).unwrap();
    assert!(sent.len() >= 4, "{sent:?}");
    assert!(
        sent.iter().all(|header| header == "Bearer s3cret"),
        "{sent:?}"
    );
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_on_a_follower_shows_the_new_leader_after_the_leader_is_killed() {
    let _one = ONE_BROWSER_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(dir.path(), 3).await;
    let browser = Browser::start().await;
    // On a busy machine (Chromium starting up), an election may come
    // between finding the leader and the page showing it, and the node
    // opened as a follower may be the new leader: then start over.
    let mut elections = 0;
    let leader = loop {
        let leader = cluster.wait_for_leader(Duration::from_secs(30));
        let follower = (1..=3).find(|id| *id != leader).unwrap();
        let page = format!("{}/ui", cluster.node(follower).endpoint());
        browser.client.goto(&page).await.unwrap();
        let old = format!("node {leader} at");
        let shown = browser
            .shows("#leader", |t| t.starts_with(&old))
            .await
            .is_ok()
            && browser
                .shows("#node", |t| t.contains("follower"))
                .await
                .is_ok();
        if shown && cluster.agreed_leader() == Some(leader) {
            break leader;
        }
        elections += 1;
        assert!(
            elections < 5,
            "the leader kept changing: {}",
            cluster.logs()
        );
    };

    browser
        .wait_text("#peer-auth", "how peers authenticate", |t| {
            t == "cluster-secret"
        })
        .await;
    // Each member's release and numbers, as each member reports them.
    let version = std::process::Command::new(common::BIN)
        .arg("version")
        .output()
        .unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    let release = env!("CARGO_PKG_VERSION");
    let data_format = version
        .split("data format ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap()
        .to_owned();
    for id in 1..=3 {
        let row = format!(r#"#members tr[data-node="{id}"]"#);
        let expected = format!("{release} (data {data_format}, backup ");
        browser
            .wait_text(&row, "the member's release", |t| t.contains(&expected))
            .await;
    }

    cluster.kill9(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(30));
    let new = format!("node {new_leader} at");
    browser
        .wait_text("#leader", "the new leader", |t| t.starts_with(&new))
        .await;
    browser.close().await;
}
