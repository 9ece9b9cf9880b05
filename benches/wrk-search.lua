-- wrk cross-check of the load generator (scripts/bench.sh): text -> image searches with a real sentence.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"text": "a black dog is running through the grass", "k": 10}'
