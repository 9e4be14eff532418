#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>

#include "json.h"

using ferry::json::dump;
using ferry::json::Kind;
using ferry::json::parse;
using ferry::json::parse_file;
using ferry::json::Value;

namespace {

Value must_parse(const std::string& text) {
    auto v = parse(text);
    EXPECT_TRUE(v.has_value()) << text << " -> " << v.message();
    return v ? v.value() : Value();
}

// Parses `text`, expects failure, returns the message.
std::string must_fail(const std::string& text) {
    auto v = parse(text);
    EXPECT_FALSE(v.has_value()) << "accepted: " << text;
    return v ? std::string() : v.message();
}

}  // namespace

TEST(Json, Scalars) {
    EXPECT_TRUE(must_parse("null").is_null());
    EXPECT_TRUE(must_parse("true").as_bool());
    EXPECT_TRUE(must_parse("false").is_bool());
    EXPECT_FALSE(must_parse("false").as_bool());
    EXPECT_EQ(must_parse("0").as_number(), 0.0);
    EXPECT_EQ(must_parse("-0").as_number(), 0.0);
    EXPECT_TRUE(std::signbit(must_parse("-0").as_number()));
    EXPECT_EQ(must_parse("  42 \n").as_number(), 42.0);
    EXPECT_EQ(must_parse("-12.5e2").as_number(), -1250.0);
    EXPECT_EQ(must_parse("1E+2").as_number(), 100.0);
    EXPECT_EQ(must_parse("1e-2").as_number(), 0.01);
    EXPECT_EQ(must_parse("\"hi\"").as_string(), "hi");
}

TEST(Json, NumbersAreCorrectlyRounded) {
    // Values whose shortest round-trip text needs all 17 digits, and the classic hard cases.
    const double cases[] = {0.1,
                            1.0 / 3.0,
                            2.2250738585072014e-308,
                            4.9406564584124654e-324,
                            1.7976931348623157e308,
                            9007199254740993.0,
                            -0.5249327421188354,
                            0.0009927749633789062,
                            123456789012345678.0};
    for (double d : cases) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.17g", d);
        EXPECT_EQ(must_parse(buf).as_number(), d) << buf;
        EXPECT_EQ(must_parse(dump(Value(d))).as_number(), d);
    }
    // Exact decimal inputs with many digits.
    EXPECT_EQ(must_parse("2.2250738585072011e-308").as_number(), 2.2250738585072011e-308);
    EXPECT_EQ(must_parse("0.30000000000000004").as_number(), 0.30000000000000004);
    EXPECT_EQ(must_parse("1.00000000000000011102230246251565404236316680908203125").as_number(),
              1.0);
    // Underflow is not an error; overflow is.
    EXPECT_EQ(must_parse("1e-400").as_number(), 0.0);
    EXPECT_NE(must_fail("1e400").find("out of range"), std::string::npos);
    EXPECT_NE(must_fail("-1e400").find("out of range"), std::string::npos);
}

TEST(Json, IntegerHelpers) {
    EXPECT_TRUE(must_parse("12").is_integer());
    EXPECT_FALSE(must_parse("12.5").is_integer());
    EXPECT_EQ(must_parse("-7").as_int(), -7);
    EXPECT_EQ(must_parse("1e300").as_int(), std::numeric_limits<int64_t>::max());
    EXPECT_FALSE(must_parse("1e300").is_integer());
    EXPECT_EQ(must_parse("\"x\"").as_int(), 0);
}

TEST(Json, Strings) {
    EXPECT_EQ(must_parse(R"("a\"b\\c\/d\b\f\n\r\t")").as_string(), "a\"b\\c/d\b\f\n\r\t");
    EXPECT_EQ(must_parse(R"("\u0041\u00e9\u20AC")").as_string(), "A\xc3\xa9\xe2\x82\xac");
    EXPECT_EQ(must_parse(R"("\u0000")").as_string(), std::string(1, '\0'));
    // Surrogate pair: U+1F600.
    EXPECT_EQ(must_parse(R"("\uD83D\uDE00")").as_string(), "\xF0\x9F\x98\x80");
    // U+10FFFF, the last code point.
    EXPECT_EQ(must_parse(R"("\uDBFF\uDFFF")").as_string(), "\xF4\x8F\xBF\xBF");
    // Raw UTF-8 passes through.
    EXPECT_EQ(must_parse("\"\xe2\x96\x81the \xf0\x9f\x98\x80\"").as_string(),
              "\xe2\x96\x81the \xf0\x9f\x98\x80");
}

TEST(Json, BadStrings) {
    EXPECT_NE(must_fail(R"("\uD83D")").find("surrogate"), std::string::npos);
    EXPECT_NE(must_fail(R"("\uD83Dx")").find("surrogate"), std::string::npos);
    EXPECT_NE(must_fail(R"("\uD83D\u0041")").find("surrogate"), std::string::npos);
    EXPECT_NE(must_fail(R"("\uDE00")").find("surrogate"), std::string::npos);
    EXPECT_NE(must_fail(R"("\u12G4")").find("hex"), std::string::npos);
    EXPECT_NE(must_fail(R"("\u12)").find("\\u"), std::string::npos);
    EXPECT_NE(must_fail(R"("\x")").find("escape"), std::string::npos);
    EXPECT_NE(must_fail("\"a\nb\"").find("control"), std::string::npos);
    EXPECT_NE(must_fail("\"abc").find("unterminated"), std::string::npos);
    EXPECT_NE(must_fail("\"abc\\").find("unterminated"), std::string::npos);
    // Ill-formed UTF-8: stray continuation, overlong, encoded surrogate, past U+10FFFF,
    // truncated sequence.
    for (const char* bad : {"\"\x80\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
                            "\"\xe2\x82\"", "\"\xff\""}) {
        EXPECT_NE(must_fail(bad).find("UTF-8"), std::string::npos) << bad;
    }
}

TEST(Json, ArraysAndObjects) {
    Value v = must_parse(R"({"a": [1, 2, {"b": null}], "c": {"d": "e"}, "f": []  , "g": {}})");
    ASSERT_TRUE(v.is_object());
    EXPECT_EQ(v.size(), 4u);
    EXPECT_EQ(v.object[0].first, "a");
    EXPECT_EQ(v.object[3].first, "g");
    EXPECT_EQ(v["a"].size(), 3u);
    EXPECT_EQ(v["a"].at(1).as_number(), 2.0);
    EXPECT_TRUE(v["a"].at(2).contains("b"));
    EXPECT_TRUE(v["a"].at(2)["b"].is_null());
    EXPECT_EQ(v["c"]["d"].as_string(), "e");
    EXPECT_TRUE(v["f"].is_array());
    EXPECT_EQ(v["f"].size(), 0u);
    EXPECT_TRUE(v["g"].is_object());
    // Missing things are null, and chains through them stay null.
    EXPECT_TRUE(v["zz"].is_null());
    EXPECT_EQ(v.find("zz"), nullptr);
    EXPECT_TRUE(v["zz"]["y"].at(4).is_null());
    EXPECT_TRUE(v["a"].at(99).is_null());
    EXPECT_EQ(v["a"].as_string(), "");
    EXPECT_TRUE(v["c"].as_array().empty());
}

TEST(Json, Errors) {
    EXPECT_NE(must_fail("").find("end of input"), std::string::npos);
    EXPECT_NE(must_fail("   ").find("end of input"), std::string::npos);
    EXPECT_NE(must_fail("[1, 2").find("end of input"), std::string::npos);
    EXPECT_NE(must_fail("[1 2]").find("expected ',' or ']'"), std::string::npos);
    EXPECT_NE(must_fail("[1,]").find("expected a value"), std::string::npos);
    EXPECT_NE(must_fail("{\"a\" 1}").find("expected ':'"), std::string::npos);
    EXPECT_NE(must_fail("{a: 1}").find("string key"), std::string::npos);
    EXPECT_NE(must_fail("{\"a\": 1,}").find("string key"), std::string::npos);
    EXPECT_NE(must_fail("{\"a\": 1, \"a\": 2}").find("duplicate object key \"a\""),
              std::string::npos);
    EXPECT_NE(must_fail("tru").find("true"), std::string::npos);
    EXPECT_NE(must_fail("nul").find("null"), std::string::npos);
    EXPECT_NE(must_fail("1 2").find("after the end"), std::string::npos);
    EXPECT_NE(must_fail("01").find("leading zeros"), std::string::npos);
    EXPECT_NE(must_fail("1.").find("after '.'"), std::string::npos);
    EXPECT_NE(must_fail(".5").find("expected a value"), std::string::npos);
    EXPECT_NE(must_fail("+1").find("expected a value"), std::string::npos);
    EXPECT_NE(must_fail("1e").find("exponent"), std::string::npos);
    EXPECT_NE(must_fail("-").find("digit"), std::string::npos);
    EXPECT_NE(must_fail("NaN").find("expected a value"), std::string::npos);
    EXPECT_NE(must_fail("[1] // c").find("after the end"), std::string::npos);
    EXPECT_NE(must_fail(std::string("[1]\0", 4)).find("byte 0x00"), std::string::npos);
}

TEST(Json, ErrorsNameLineAndColumn) {
    EXPECT_NE(must_fail("{\n  \"a\": 1,\n  \"b\": tru\n}").find("line 3, column 8"),
              std::string::npos);
    EXPECT_NE(must_fail("[1, 2,\n\n   x]").find("line 3, column 4"), std::string::npos);
    EXPECT_NE(must_fail("x").find("line 1, column 1"), std::string::npos);
    // The duplicate key is reported where the second one starts.
    EXPECT_NE(must_fail("{\"k\": 1,\n \"k\": 2}").find("line 2, column 2"), std::string::npos);
}

TEST(Json, DepthLimit) {
    const std::string ok = std::string(500, '[') + std::string(500, ']');
    EXPECT_TRUE(parse(ok).has_value());
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    EXPECT_NE(must_fail(deep).find("nesting"), std::string::npos);
    std::string deep_obj;
    for (int i = 0; i < 100000; i++) deep_obj += "{\"a\":";
    EXPECT_NE(must_fail(deep_obj).find("nesting"), std::string::npos);
}

TEST(Json, Bom) {
    EXPECT_EQ(must_parse("\xEF\xBB\xBF[1]").at(0).as_number(), 1.0);
}

TEST(Json, Dump) {
    EXPECT_EQ(dump(Value()), "null");
    EXPECT_EQ(dump(Value(true)), "true");
    EXPECT_EQ(dump(Value(1.5)), "1.5");
    EXPECT_EQ(dump(Value(3)), "3");
    EXPECT_EQ(dump(Value(0.1)), "0.10000000000000001");
    EXPECT_EQ(dump(Value(std::nan(""))), "null");
    EXPECT_EQ(dump(Value(std::numeric_limits<double>::infinity())), "null");
    EXPECT_EQ(dump(Value(std::string("a\"\\\n\x01\xc3\xa9", 7))),
              "\"a\\\"\\\\\\n\\u0001\xc3\xa9\"");
    Value o;
    o.set("x", Value(1));
    o.set("y", Value::make_array());
    o.set("x", Value("replaced"));
    Value& arr = o.set("z", Value());
    arr.push_back(Value(false));
    arr.push_back(Value(nullptr));
    EXPECT_EQ(dump(o), R"({"x":"replaced","y":[],"z":[false,null]})");
    EXPECT_EQ(dump(o, 2),
              "{\n  \"x\": \"replaced\",\n  \"y\": [],\n  \"z\": [\n    false,\n"
              "    null\n  ]\n}");
}

TEST(Json, RoundTrip) {
    const std::string text =
        R"({"s":"\u00e9\ud83d\ude00\"\\\n","n":[0,-1,1e-300,1.7976931348623157e308,)"
        R"(0.30000000000000004],"b":[true,false,null],"o":{"k":{"k":{}}}})";
    Value v = must_parse(text);
    Value again = must_parse(dump(v));
    EXPECT_TRUE(v == again);
    Value pretty = must_parse(dump(v, 4));
    EXPECT_TRUE(v == pretty);
    EXPECT_EQ(dump(again), dump(v));
}

TEST(Json, ParseFile) {
    const std::string path = ::testing::TempDir() + "ferry_test_json.json";
    {
        std::ofstream f(path, std::ios::binary);
        f << "{\"a\": [1, 2,\n 3}";
    }
    auto bad = parse_file(path);
    ASSERT_FALSE(bad.has_value());
    EXPECT_NE(bad.message().find(path), std::string::npos);
    EXPECT_NE(bad.message().find("line 2, column 3"), std::string::npos) << bad.message();
    {
        std::ofstream f(path, std::ios::binary);
        f << "{\"a\": [1, 2, 3]}";
    }
    auto good = parse_file(path);
    ASSERT_TRUE(good.has_value()) << good.message();
    EXPECT_EQ(good.value()["a"].at(2).as_number(), 3.0);
    std::remove(path.c_str());

    auto missing = parse_file(path + ".does-not-exist");
    ASSERT_FALSE(missing.has_value());
    EXPECT_NE(missing.message().find("cannot open"), std::string::npos);
}

TEST(Json, FixtureFile) {
    auto v = parse_file(FERRY_FIXTURES_DIR "/tiny-llama/dequant-checks.json");
    ASSERT_TRUE(v.has_value()) << v.message();
    const Value& files = v.value()["files"];
    ASSERT_TRUE(files.is_object());
    EXPECT_EQ(files.size(), 8u);
    const Value& t0 = files["tiny-llama-f16.gguf"].at(0);
    EXPECT_EQ(t0["name"].as_string(), "output.weight");
    EXPECT_EQ(t0["sum"].as_number(), -314.72811633348465);
    EXPECT_EQ(t0["first16"].at(0).as_number(), -0.0247650146484375);
}
