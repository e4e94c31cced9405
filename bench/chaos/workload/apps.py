from django.apps import AppConfig


class ChaosConfig(AppConfig):
    name = "bench.chaos.workload"
    label = "chaos"
