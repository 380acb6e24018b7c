from django.apps import AppConfig


class SearchIndexesConfig(AppConfig):
    name = "django_delayq.contrib.search_indexes"
    label = "delayq_search_indexes"
    verbose_name = "django-delayq search indexes"
