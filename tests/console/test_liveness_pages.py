"""The run and worker pages show the run-lease article's liveness states (issue 13, item 2)."""


def test_the_run_and_worker_pages_show_the_states(api_for, acme, viewer_client):
    client = api_for(acme)
    run_id = client.create_run()
    client.acquire(run_id, "agent-a")
    client.post("/workers/me/heartbeat", {})
    page = viewer_client.get(f"/runs/{run_id}/").content.decode()
    assert ">PROCESS_ALIVE</span>" in page and ">LEASE_VALID</span>" in page
    page = viewer_client.get(f"/workers/{acme.worker.pk}/").content.decode()
    assert ">PROCESS_ALIVE</span>" in page and "1 lease valid" in page
