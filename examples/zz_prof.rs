use idemcache::*;
use bytes::Bytes;
use std::time::Instant;
use std::hint::black_box;
fn run(name: &str, cache: &Cache, k: &Key, fp: Fingerprint) {
    let n = 20_000_000u64;
    let t = Instant::now();
    let mut s = 0usize;
    for _ in 0..n {
        if let Ok(Claim::Completed(r)) = cache.claim(black_box(k), fp) { s += r.body.map_or(0, |b| b.len()); }
    }
    println!("{name}: {:.1} ns {s}", t.elapsed().as_nanos() as f64 / n as f64);
}
fn main() {
    let k = Key::new("POST /v1/orders", "user:42", "0000000000000001").unwrap();
    let fp = Fingerprint::of(b"request");
    for (name, cache) in [("system", Cache::builder().build().unwrap()), ("manual", Cache::builder().clock(ManualClock::new()).build().unwrap())] {
        let Ok(Claim::Acquired(g)) = cache.claim(&k, fp) else { panic!() };
        g.complete(Bytes::from_static(&[b'r'; 128])).unwrap();
        run(name, &cache, &k, fp);
        let n = 20_000_000u64;
        let t = Instant::now();
        let mut s = 0;
        for _ in 0..n { s += black_box(&cache).peek(black_box(&k)).is_some() as usize; }
        println!("{name} peek: {:.1} ns {s}", t.elapsed().as_nanos() as f64 / n as f64);
    }
    let m = dashmap::DashMap::with_hasher(ahash::RandomState::new());
    m.insert(k.as_bytes().to_vec(), Bytes::from_static(&[b'r'; 128]));
    let n = 20_000_000u64;
    let t = Instant::now();
    let mut s = 0;
    for _ in 0..n { s += m.get(black_box(k.as_bytes())).map(|v| v.clone()).map_or(0, |b| b.len()); }
    println!("dashmap: {:.1} ns {s}", t.elapsed().as_nanos() as f64 / n as f64);
    {
        let h = ahash::RandomState::new();
        let mut t0 = hashbrown::HashTable::<(Key, Bytes)>::new();
        let hk = h.hash_one(k.as_bytes());
        t0.insert_unique(hk, (k.clone(), Bytes::from_static(&[b'r'; 128])), |e| h.hash_one(e.0.as_bytes()));
        let m = parking_lot::Mutex::new(t0);
        let t = Instant::now();
        let mut s = 0;
        for _ in 0..n {
            let kk = black_box(&k);
            let hh = h.hash_one(kk.as_bytes());
            let g = m.lock();
            s += g.find(hh, |e| e.0 == *kk).map(|e| e.1.clone()).map_or(0, |b| b.len());
        }
        println!("mutex+hashtable: {:.1} ns {s}", t.elapsed().as_nanos() as f64 / n as f64);
    }
    let pm = parking_lot::Mutex::new(0u64);
    let t = Instant::now();
    for _ in 0..n { *black_box(&pm).lock() += 1; }
    println!("pl mutex: {:.1} ns", t.elapsed().as_nanos() as f64 / n as f64);
    let h = ahash::RandomState::new();
    let t = Instant::now();
    for _ in 0..n { s += h.hash_one(black_box(k.as_bytes())) as usize & 1; }
    println!("ahash: {:.1} ns {s}", t.elapsed().as_nanos() as f64 / n as f64);
}
