"""The Triton glue: the `rose` Python model (rose_model.py) and what the models of this project need to
live inside Triton's Python backend stub (model_settings.py: rose's config.pbtxt parameters and the base of every model's;
decoupled.py: the execute() of a decoupled model; stub_path.py: every model.py's first step, the
launcher's paths; request_inputs.py; numpy_interop.py; parent_watch.py;
polled_metrics.py, lane_metrics.py: their Prometheus series). The serving core below it
(rose_backend/serving) imports none of this."""
