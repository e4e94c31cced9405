"""django.tasks on Palisade (jobs.tasks): the backend, results, execution, signals."""
