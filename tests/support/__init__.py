"""What the tests share: real tritonservers and gateways, launcher runs, leftovers, metrics, raw HTTP."""
