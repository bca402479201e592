"""`manage.py check` reports misconfigured validator profiles."""

from django.core import checks

from validation.profiles import all_profiles, profile_problems


@checks.register()
def validator_profiles(app_configs, **kwargs):
    errors = []
    for name, profile in all_profiles().items():
        for problem in profile_problems(name, profile):
            errors.append(checks.Error(problem, id="fusion.E001", hint="Fix FUSION_VALIDATORS."))
    return errors
